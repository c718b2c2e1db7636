"""Accelerator placement: which accelerators an instance of a given TP gets, and whether a
set of pool sizes fits the cluster at all. Tensor parallelism stays inside one node."""

from __future__ import annotations

from collections.abc import Iterable


def allocate(used: set[int], per_node: int, nodes: int, tp: int, share: int = 1
             ) -> tuple[int, ...] | None:
    """The lowest free placement slots of one node that give ``tp`` distinct accelerators,
    or None. Without sharing a slot is an accelerator; see ``physical``."""
    if tp > per_node:
        return None
    slots = per_node * share
    for node in range(nodes):
        chosen: list[int] = []
        devices: set[int] = set()
        for k in range(slots):
            slot = node * slots + k
            if slot in used or k % per_node in devices:
                continue
            chosen.append(slot)
            devices.add(k % per_node)
            if len(chosen) == tp:
                return tuple(chosen)
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


def physical(slot: int, per_node: int, share: int) -> int:
    """The accelerator a placement slot runs on when ``share`` instances may share one.

    Slots are numbered per node (``per_node * share`` of them); slot k of a node maps to its
    accelerator ``k % per_node``, so consecutive slots -- one TP group -- land on distinct
    accelerators.
    """
    slots = per_node * share
    node, k = divmod(slot, slots)
    return node * per_node + k % per_node
