"""What an operator's change will do, decided before it is sent: which changes are disruptive
(and so need a confirmation) and what the controller will do to converge. Pure functions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["prefill", "decode"]


@dataclass(frozen=True)
class PendingChange:
    """A change awaiting the operator's confirmation."""

    kind: Literal["pool", "drain"]
    title: str
    effects: tuple[str, ...]
    disruptive: bool
    role: Role | None = None
    size: int | None = None
    tp: int | None = None
    instance_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def pool_change(role: Role, size: int, tp: int, new_size: int, new_tp: int
                ) -> PendingChange | None:
    """The change from ``size x TP tp`` to ``new_size x TP new_tp``, or None if nothing
    changes. Scaling down and changing TP are disruptive: instances are drained."""
    if (size, tp) == (new_size, new_tp):
        return None
    effects: list[str] = []
    if new_size > size:
        effects.append(f"starts {new_size - size} {role} instance(s) at TP {new_tp}")
    if new_size < size:
        effects.append(f"drains {size - new_size} {role} instance(s), least loaded first: "
                       "they take no new requests and stop when their requests finish")
    if new_tp != tp:
        effects.append(f"replaces every {role} instance, one at a time, from TP {tp} to TP "
                       f"{new_tp}: a new instance must be ready before an old one drains")
    return PendingChange(
        kind="pool", title=f"{role} pool: {size} x TP{tp} → {new_size} x TP{new_tp}",
        effects=tuple(effects), disruptive=new_size < size or new_tp != tp, role=role,
        size=new_size if new_size != size else None, tp=new_tp if new_tp != tp else None)


def drain_change(instance: dict[str, Any]) -> PendingChange:
    load = instance.get("load", {})
    return PendingChange(
        kind="drain", title=f"drain {instance['id']} ({instance['role']}, {instance['state']}, "
                            f"TP {instance['tp']})",
        effects=(f"{instance['id']} takes no new requests; its {load.get('inflight', 0)} "
                 "in-flight request(s) finish, then it stops",
                 "the controller starts a replacement if the pool falls below its desired "
                 "size"),
        disruptive=True, instance_id=str(instance["id"]))


ROUTING_FIELDS = ("prefill_policy", "decode_policy", "disagg_min_prompt_tokens",
                  "transfer_alert_share", "max_attempts", "request_timeout_s")


def routing_patch(current: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """Only the routing fields the operator actually changed."""
    patch: dict[str, Any] = {}
    for key in ROUTING_FIELDS:
        if key not in wanted:
            continue
        new, old = wanted[key], current.get(key)
        if isinstance(new, float) and isinstance(old, int | float):
            if abs(new - float(old)) > 1e-9:
                patch[key] = new
        elif new != old:
            patch[key] = new
    return patch


def drainable(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Instances the controller accepts a drain for (ready or starting)."""
    return [i for i in instances if i["state"] in ("ready", "starting")]
