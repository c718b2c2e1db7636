"""Checks a desired pool change against the model, the hardware and the NIXL connector.

Pure functions that raise ``InvalidChange`` with an operator-readable reason; the API maps
that to 422 and nothing is changed or recorded as applied.
"""

from __future__ import annotations

from controller.errors import InvalidChange
from controller.models import PoolTarget, Role
from controller.sizing import placement
from pdctl_api import profiles

NIXL_TP_RULE = (
    "vLLM's NixlConnector supports heterogeneous TP between prefill and decode only when the "
    "larger TP is a multiple of the smaller"
)


def check_tp(m: profiles.ModelProfile, hw: profiles.HardwareProfile, per_node: int,
             tp: int, role: Role) -> None:
    """TP must divide the heads and KV heads, stay within a node, and fit memory."""
    where = f"pools.{role.value}.tp"
    if tp < 1:
        raise InvalidChange(f"TP must be at least 1, got {tp}", where)
    if tp > per_node:
        raise InvalidChange(
            f"TP {tp} exceeds the {per_node} accelerators per node ({hw.name}); "
            "tensor parallelism stays within one node", where)
    for what, count in (("attention heads", m.heads), ("KV heads", m.kv_heads)):
        if count % tp:
            raise InvalidChange(
                f"TP {tp} does not divide {m.name}'s {count} {what}", where)
    problem = profiles.fit_problem(m, hw, tp)
    if problem:
        raise InvalidChange(problem, where)


def check_pairing(prefill_tp: int, decode_tp: int) -> None:
    small, large = sorted((prefill_tp, decode_tp))
    if large % small:
        raise InvalidChange(
            f"prefill TP {prefill_tp} and decode TP {decode_tp}: {NIXL_TP_RULE}", "tp")


def valid_tps(m: profiles.ModelProfile, hw: profiles.HardwareProfile, per_node: int,
              role: Role, other_tp: int) -> list[int]:
    """The TPs ``role`` may take beside the other pool's ``other_tp``: ``check_tp`` and
    ``check_pairing`` pass (the cluster's room for the pool's size is not judged here)."""
    out = []
    for tp in range(1, per_node + 1):
        try:
            check_tp(m, hw, per_node, tp, role)
            check_pairing(tp, other_tp)
        except InvalidChange:
            continue
        out.append(tp)
    return out


def check_capacity(targets: dict[Role, PoolTarget], per_node: int, nodes: int) -> None:
    demands = [t.tp for t in targets.values() for _ in range(t.size)]
    if not placement.fits(demands, per_node, nodes):
        need = sum(demands)
        parts = ", ".join(f"{r.value} {t.size} x TP{t.tp}" for r, t in targets.items())
        raise InvalidChange(
            f"{parts} needs {need} accelerators placed TP-group-per-node, but the cluster has "
            f"{nodes} node(s) x {per_node} = {nodes * per_node}", "size")


def check_change(
    targets: dict[Role, PoolTarget], role: Role, size: int | None, tp: int | None, *,
    model: profiles.ModelProfile, hw: profiles.HardwareProfile, per_node: int, nodes: int,
    managed: bool, share: int = 1,
) -> dict[Role, PoolTarget]:
    """The new targets if the change is valid; raises ``InvalidChange`` otherwise."""
    if size is None and tp is None:
        raise InvalidChange("nothing to change: give size and/or tp")
    if not managed:
        raise InvalidChange(
            "backend external: pools are the configured URLs; change them in the config file")
    old = targets[role]
    new = PoolTarget(size=old.size if size is None else size, tp=old.tp if tp is None else tp)
    if new.size < 0:
        raise InvalidChange(f"size must be >= 0, got {new.size}", f"pools.{role.value}.size")
    if role is Role.DECODE and new.size < 1:
        raise InvalidChange("the decode pool needs at least 1 instance: it serves every "
                            "request", "pools.decode.size")
    merged = {**targets, role: new}
    check_targets(merged, model=model, hw=hw, per_node=per_node, nodes=nodes, share=share)
    return merged


def check_targets(targets: dict[Role, PoolTarget], *, model: profiles.ModelProfile,
                  hw: profiles.HardwareProfile, per_node: int, nodes: int, share: int = 1
                  ) -> None:
    """Every pool's TP, the prefill/decode TP pairing, and the capacity of the whole set."""
    for role, target in targets.items():
        check_tp(model, hw, per_node, target.tp, role)
    check_pairing(targets[Role.PREFILL].tp, targets[Role.DECODE].tp)
    check_capacity(targets, per_node * share, nodes)
