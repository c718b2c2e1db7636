"""Accelerator placement: which accelerators an instance of a given TP gets, and whether a
set of pool sizes fits the cluster at all. Tensor parallelism stays inside one node."""

from __future__ import annotations

from collections.abc import Iterable


def allocate(used: set[int], per_node: int, nodes: int, tp: int) -> tuple[int, ...] | None:
    """The lowest free accelerators of one node that hold ``tp`` of them, or None."""
    if tp > per_node:
        return None
    for node in range(nodes):
        free = [node * per_node + k for k in range(per_node) if node * per_node + k not in used]
        if len(free) >= tp:
            return tuple(free[:tp])
    return None


def fits(demands: Iterable[int], per_node: int, nodes: int) -> bool:
    """Whether instances needing ``demands`` accelerators each pack into the nodes
    (first-fit decreasing; exact for the power-of-two TPs used in practice)."""
    free = [per_node] * nodes
    for need in sorted(demands, reverse=True):
        for n, left in enumerate(free):
            if left >= need:
                free[n] -= need
                break
        else:
            return False
    return True
