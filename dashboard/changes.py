"""What an operator's change will do, shown before it is sent: a pool change as the
controller's own plan for it (the dry run's actions; a change of the KV transfer mode drains
and restarts instances like a TP change), whether a change is disruptive (and so
needs a confirmation), a drain, and which routing fields changed. Pure functions: the dry run
itself is one call of the client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dashboard.frames import change_in_words
from pdctl_api.schema import (
    ROUTING_FIELDS,
    ForecastPublic,
    InstancePublic,
    PlannedAction,
    PoolPlanPublic,
    Role,
    RoutingPublic,
    TargetsPublic,
)


@dataclass(frozen=True)
class PendingChange:
    """A change awaiting the operator's confirmation."""

    kind: Literal["pool", "drain", "routing", "targets"]
    title: str
    effects: tuple[str, ...]
    disruptive: bool
    role: Role | None = None
    size: int | None = None
    tp: int | None = None
    instance_id: str | None = None
    kv_mode: str | None = None  # pool: the KV transfer mode to send (None: unchanged)
    patch: tuple[tuple[str, Any], ...] | None = None  # routing: the fields to send
    prediction: ForecastPublic | str | None = None  # pool: the what-if, or why there is none


@dataclass(frozen=True)
class PoolRequest:
    """The fields a pool change sends: only those that differ from the desired state."""

    size: int | None
    tp: int | None
    kv_mode: str | None = None


def pool_request(size: int, tp: int, new_size: int, new_tp: int, kv_mode: str = "pull",
                 new_kv_mode: str | None = None) -> PoolRequest | None:
    """The change from ``size x TP tp`` (KV ``kv_mode``) to ``new_size x TP new_tp`` (KV
    ``new_kv_mode``, unchanged when None); None if nothing changes."""
    new_mode = kv_mode if new_kv_mode is None else new_kv_mode
    if (size, tp, kv_mode) == (new_size, new_tp, new_mode):
        return None
    return PoolRequest(size=new_size if new_size != size else None,
                       tp=new_tp if new_tp != tp else None,
                       kv_mode=new_mode if new_mode != kv_mode else None)


def action_text(a: PlannedAction) -> str:
    """One planned action, in the controller's words (its ``reason``)."""
    if a.kind == "start":
        # Pull is the default and every older controller's: only push is worth a word.
        mode = " (KV push)" if getattr(a, "kv_mode", None) == "push" else ""
        return f"**start** a {a.role} instance at TP {a.tp}{mode} — {a.reason}"
    if a.kind == "drain":
        return (f"**drain** {a.instance_id} (no new requests; it stops when its requests "
                f"finish) — {a.reason}")
    return f"**stop** {a.instance_id} — {a.reason}"


NOTHING_PLANNED = ("the controller plans nothing right now (instances it already started or "
                   "drained cover the change)")


def kv_mode_effect(role: Role, old: str, new: str) -> str:
    """What a change of the pool's KV transfer mode does, in words."""
    how = ("the router sends both hops at once and the prefill engine writes the KV into "
           "the decode engine's blocks (NixlPushConnector)" if new == "push" else
           "the decode engine reads the KV once the prefill hop is done (NixlConnector)")
    return (f"KV transfer {old} → {new}: like a TP change, every {role} instance is drained "
            f"(its requests finish) and restarted with the new connector, a rolling replace "
            f"until the pool has converged; then {how}")


def pool_change(role: Role, size: int, tp: int, plan: PoolPlanPublic,
                kv_mode: str = "pull") -> PendingChange:
    """The reviewed change from ``size x TP tp`` (KV ``kv_mode``) to the plan's desired pool,
    its effects the controller's planned actions. Scaling down and changing TP or the KV
    transfer mode are disruptive (instances drain and restart), and so is any plan that
    drains or stops an instance."""
    new = plan.desired
    new_mode = getattr(new, "kv_mode", kv_mode) or kv_mode
    mode_changed = new_mode != kv_mode
    disruptive = (new.size < size or new.tp != tp or mode_changed
                  or any(a.kind != "start" for a in plan.actions))
    modes = f", KV {kv_mode} → {new_mode}" if mode_changed else ""
    return PendingChange(
        kind="pool", title=f"{role} pool: {size} x TP{tp} → {new.size} x TP{new.tp}{modes}",
        effects=((kv_mode_effect(role, kv_mode, new_mode),) if mode_changed else ())
        + (tuple(action_text(a) for a in plan.actions) or (NOTHING_PLANNED,))
        + tuple(plan.notes),
        disruptive=disruptive, role=role,
        size=new.size if new.size != size else None, tp=new.tp if new.tp != tp else None,
        kv_mode=new_mode if mode_changed else None)


def drain_change(instance: InstancePublic) -> PendingChange:
    i = instance
    return PendingChange(
        kind="drain", title=f"drain {i.id} ({i.role}, {i.state}, TP {i.tp})",
        effects=(f"{i.id} takes no new requests; its {i.load.inflight} in-flight request(s) "
                 + (f"finish and the {i.load.kv_handles_out} KV handle(s) it gave out are read "
                    "or expire, " if i.load.kv_handles_out else "finish, ")
                 + "then it stops",
                 "the controller starts a replacement if the pool falls below its desired "
                 "size"),
        disruptive=True, instance_id=i.id)


def routing_patch(current: RoutingPublic, wanted: dict[str, Any]) -> dict[str, Any]:
    """Only the routing fields the operator actually changed."""
    patch: dict[str, Any] = {}
    for key in ROUTING_FIELDS:
        if key not in wanted:
            continue
        new, old = wanted[key], getattr(current, key)
        if isinstance(new, float) and isinstance(old, int | float):
            if abs(new - float(old)) > 1e-9:
                patch[key] = new
        elif new != old:
            patch[key] = new
    return patch


# Routing fields whose lower value refuses or cuts requests: lowering them is disruptive.
TIGHTENING = ("max_inflight", "max_inflight_per_instance", "prefill_max_inflight",
              "request_timeout_s", "prefill_queue_timeout_s", "max_attempts")


def _tightens(key: str, old: Any, new: Any) -> bool:
    if key not in TIGHTENING:
        return False
    limitless = key in ("max_inflight", "max_inflight_per_instance", "prefill_max_inflight")
    if limitless and new == 0:
        return False  # 0: no limit
    return bool((limitless and old == 0) or new < old)


def threshold_preview(old: int, new: int, prompts: list[int]) -> str:
    """How many of the recent requests a new disaggregation threshold would have moved."""
    if not prompts:
        return "no recent requests to preview the new threshold against"
    lo, hi = min(old, new), max(old, new)
    moved = sum(1 for p in prompts if lo <= p < hi)
    where = "colocated instead of disaggregated" if new > old else \
        "disaggregated instead of colocated"
    return (f"of the last {len(prompts)} requests, {moved} ({moved / len(prompts):.0%}) had "
            f"prompts of {lo}-{hi - 1} tokens: they would have gone {where}")


CACHE_AWARE = "cache_aware"
POLICY_POOLS = {"prefill_policy": "prefill", "decode_policy": "decode"}


def cache_notes(current: RoutingPublic, patch: dict[str, Any]) -> list[str]:
    """What a change of the routing by prefix cache does: a pool that starts or stops routing
    ``cache_aware``, and a ``cache_load_limit`` that no pool would use."""
    limit = patch.get("cache_load_limit", current.cache_load_limit)
    out = []
    for key, pool in POLICY_POOLS.items():
        if key not in patch:
            continue
        if patch[key] == CACHE_AWARE:
            out.append(f"the {pool} pool sends each prompt to the instance that holds its "
                       "longest cached prefix (from the engines' KV events), unless that "
                       f"instance has more than {limit} requests above the least loaded "
                       "(`cache_load_limit`); an instance whose KV index is stale, or that "
                       "publishes no events, is routed by load (Pools shows each index)")
        elif getattr(current, key) == CACHE_AWARE:
            out.append(f"the {pool} pool stops routing by prefix cache: prompts go "
                       f"{patch[key]}, wherever their prefix is cached")
    after = {k: patch.get(k, getattr(current, k)) for k in POLICY_POOLS}
    if "cache_load_limit" in patch and CACHE_AWARE not in after.values():
        out.append("`cache_load_limit` applies to a pool routed `cache_aware` only, and none "
                   "is")
    return out


HANDOFF_POLICIES = {
    "threshold": "each request goes disaggregated when its prompt has at least "
                 "`disagg_min_prompt_tokens` tokens, else local on its decode instance",
    "slo": "each request goes disaggregated only when that is faster for its uncached tokens, "
           "the queues and the KV transfer (protecting the gap target); "
           "`disagg_min_prompt_tokens` no longer decides alone",
}


def handoff_notes(patch: dict[str, Any]) -> list[str]:
    """What a change of ``disagg_policy`` does (Transfer shows the decisions it makes)."""
    new = patch.get("disagg_policy")
    if new is None:
        return []
    return [f"hand-off `{new}`: {HANDOFF_POLICIES.get(str(new), 'the controller decides')} "
            "(Transfer shows each decision and why)"]


def routing_change(current: RoutingPublic, patch: dict[str, Any],
                   recent_prompts: list[int] | None = None) -> PendingChange:
    """The reviewed routing change: each field old -> new, a preview of a threshold change
    from the recent prompt lengths, disruptive when a limit tightens."""
    effects = [f"`{k}`: {getattr(current, k)} → {v}" for k, v in patch.items()]
    if "disagg_min_prompt_tokens" in patch and recent_prompts is not None:
        effects.append(threshold_preview(current.disagg_min_prompt_tokens,
                                         int(patch["disagg_min_prompt_tokens"]),
                                         recent_prompts))
    effects += cache_notes(current, patch) + handoff_notes(patch)
    disruptive = any(_tightens(k, getattr(current, k), v) for k, v in patch.items())
    if disruptive:
        effects.append("a tighter limit: requests beyond it are refused (429), cut or served "
                       "colocated")
    was = {k: getattr(current, k) for k in patch}
    return PendingChange(kind="routing", title="routing: " + change_in_words(was, patch),
                         effects=tuple(effects), disruptive=disruptive,
                         patch=tuple(patch.items()))


def targets_change(current: TargetsPublic, wanted: dict[str, float]) -> PendingChange | None:
    """The reviewed change of the service targets: only the fields that changed; None if
    none did. Never disruptive: targets change what the console and the alerts call
    healthy, not what the fleet does."""
    patch = {k: v for k, v in wanted.items() if abs(float(v) - getattr(current, k)) > 1e-9}
    if not patch:
        return None
    was = {k: getattr(current, k) for k in patch}
    return PendingChange(kind="targets", title="targets: " + change_in_words(was, patch),
                         effects=tuple(f"`{k}`: {getattr(current, k):g} → {v:g}"
                                       for k, v in patch.items()),
                         disruptive=False, patch=tuple(patch.items()))


def drainable(instances: list[InstancePublic]) -> list[InstancePublic]:
    """Instances the controller accepts a drain for (ready or starting)."""
    return [i for i in instances if i.state.drainable]
