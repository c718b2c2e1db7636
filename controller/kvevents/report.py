"""The prefix cache over a window, from the request records and the block index: the body of
``GET /api/v1/cache`` (``pdctl_api.schema.cache``). Pure: records, index states and the
clock come in, a JSON-ready dict goes out."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from controller.kvevents.hub import IndexState
from controller.models import RequestPath, RequestRecord, Role

DRIFT_WARN = 0.10  # |drift| above this share of prompt tokens is worth a warning
DRIFT_MIN_REQUESTS = 10


@dataclass
class _Sum:
    requests: int = 0
    prompt: int = 0
    predicted: int = 0
    reported: int = 0
    n_predicted: int = 0
    n_reported: int = 0
    both_prompt: int = 0  # prompt tokens of requests with both numbers
    both_diff: int = 0  # their predicted - reported

    def add(self, r: RequestRecord) -> None:
        p, c = r.cached_tokens_predicted, r.cached_tokens
        if p is None and c is None:
            return
        self.requests += 1
        self.prompt += r.prompt_tokens
        if p is not None:
            self.predicted += p
            self.n_predicted += 1
        if c is not None:
            self.reported += c
            self.n_reported += 1
        if p is not None and c is not None:
            self.both_prompt += r.prompt_tokens
            self.both_diff += p - c

    def rates(self) -> dict[str, float | None]:
        def share(n: int, d: int, have: int) -> float | None:
            return n / d if have and d else None

        return {"hit_rate": share(self.reported, self.prompt, self.n_reported),
                "predicted_hit_rate": share(self.predicted, self.prompt, self.n_predicted),
                "drift": share(self.both_diff, self.both_prompt, self.both_prompt)}

    def public(self) -> dict[str, Any]:
        return {"requests": self.requests, "prompt_tokens": self.prompt,
                "predicted_tokens": self.predicted if self.n_predicted else None,
                "reported_tokens": self.reported if self.n_reported else None,
                **self.rates()}


def computed_on(r: RequestRecord) -> str | None:
    """The instance whose prefix cache served the prompt."""
    return r.prefill_instance if r.path is RequestPath.DISAGGREGATED else r.decode_instance


def index_public(s: IndexState) -> dict[str, Any]:
    h = s.health
    if h is None:
        return {"watched": s.watched, "healthy": False,
                "stale_reason": None if not s.watched else "no events yet"}
    return {"watched": s.watched, "healthy": s.watched and not h.stale,
            "stale_reason": h.stale_reason, "blocks": h.blocks,
            "events_per_s": round(h.events_per_s, 3), "events": h.events,
            "last_seq": h.last_seq, "replays": h.replays, "restarts": h.restarts,
            "skipped": h.skipped}


def cache_report(records: Sequence[RequestRecord], states: Iterable[IndexState],
                 roles: dict[str, Role], policies: dict[Role, str],
                 kv_bytes: Callable[[int], int] | None, window_s: float, step_s: float,
                 start: float, now: float) -> dict[str, Any]:
    """``records``: the window's finished requests; ``states``: the index of the serving
    instances; ``roles``: every instance's role (ended ones too); ``kv_bytes``: a prompt
    length's KV bytes (None: the architecture is unknown, and so are the bytes)."""
    fleet, per = _Sum(), dict[str, _Sum]()
    n_buckets = max(1, round((now - start) / step_s))
    buckets = [_Sum() for _ in range(n_buckets)]
    saved_bytes = moved_bytes = 0
    for r in records:
        if r.status != "ok":
            continue
        fleet.add(r)
        inst = computed_on(r)
        if inst is not None:
            per.setdefault(inst, _Sum()).add(r)
        k = int((r.started_at - start) // step_s)
        if 0 <= k < n_buckets:
            buckets[k].add(r)
        if r.decode_cached_tokens_predicted and kv_bytes is not None:
            saved_bytes += kv_bytes(r.decode_cached_tokens_predicted)
        moved_bytes += r.kv_bytes
    index = {s.instance: s for s in states}
    instances = []
    for iid in sorted(set(per) | set(index)):
        role = roles.get(iid)
        if role is None:
            continue
        st = index.get(iid, IndexState(iid, False, None))
        instances.append({"instance": iid, "role": role.value,
                          "kv_index": index_public(st), **(per.get(iid) or _Sum()).public()})
    tokens_saved = fleet.reported if fleet.n_reported else fleet.predicted
    return {
        "window_s": window_s, "end": now, "step_s": step_s,
        "prefill_policy": policies[Role.PREFILL], "decode_policy": policies[Role.DECODE],
        **fleet.public(), "tokens_saved": tokens_saved,
        "decode_kv_bytes_saved": None if kv_bytes is None else saved_bytes,
        "decode_kv_bytes_moved": None if kv_bytes is None else moved_bytes,
        "warnings": warnings(fleet, index, roles, policies),
        "instances": instances,
        "buckets": [{"t": start + k * step_s, **b.rates()} for k, b in enumerate(buckets)],
    }


def warnings(fleet: _Sum, index: dict[str, IndexState], roles: dict[str, Role],
             policies: dict[Role, str]) -> list[str]:
    out = []
    for role in Role:
        if policies[role] != "cache_aware":
            continue
        members = [s for iid, s in index.items() if roles.get(iid) is role]
        bad = [s for s in members if not index_public(s)["healthy"]]
        if members and bad:
            why = "; ".join(f"{s.instance}: " + (
                (s.health.stale_reason if s.health and s.health.stale_reason else
                 "no events yet") if s.watched else "publishes no KV events") for s in bad[:3])
            out.append(f"the {role.value} pool routes cache_aware but {len(bad)} of "
                       f"{len(members)} instances have no up-to-date KV index, routed by "
                       f"load: {why}")
    drift = fleet.rates()["drift"]
    if drift is not None and fleet.requests >= DRIFT_MIN_REQUESTS and abs(drift) > DRIFT_WARN:
        said = "more" if drift > 0 else "fewer"
        out.append(f"the router predicted {abs(drift):.0%} of prompt tokens {said} cache hits "
                   "than the engines reported: the block index disagrees with the engines")
    return out
