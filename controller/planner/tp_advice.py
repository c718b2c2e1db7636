"""The planner's tensor-parallelism advice: whether another TP for one pool would serve the
recent traffic as well for fewer accelerators, or better for no more, played in the
discrete-event fleet (``controller.whatif``) as the look-ahead plays it -- each candidate with
all its instances serving. For each TP a pool may take, at the recommended count's
accelerators (and one instance fewer), the replay's share within the TTFT target decides.
At most one pool's TP changes per pass (the other pool's TP is what the first may pair with).

Advice only: the live planner recommends a TP and never applies one; the operator reviews and
confirms it like any pool change. A pure function of its inputs; tests assert its ``TpAdvice``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.models import Role
from controller.planner.decide import Pools
from controller.replay.trace import TraceRequest
from controller.whatif.fleet import Goals
from controller.whatif.layout import Layout
from controller.whatif.run import RunSpec, simulate


@dataclass(frozen=True)
class TpTrial:
    role: str
    tp: int
    count: int
    accelerators: int  # of the whole layout
    share: float  # of the replayed requests within the TTFT target


@dataclass(frozen=True)
class TpAdvice:
    role: str | None  # the pool whose TP should change; None: neither
    tp: dict[str, int]  # per pool: the TP recommended (the current one where no change)
    counts: dict[str, int]  # per pool: the instances at that TP
    trials: tuple[TpTrial, ...]
    reasons: tuple[str, ...]


def advise_tp(recent: list[TraceRequest], pools: Pools, counts: tuple[int, int],
              valid: Mapping[Role, Sequence[int]], spec: RunSpec, goal: float = 0.95,
              gain: float = 0.05) -> TpAdvice:
    """The TP per pool for the recommended ``counts`` (prefill, decode) on ``pools``' TPs:
    another TP of one pool is recommended when its replay keeps ``goal`` of the requests
    within the target for fewer accelerators, or ``gain`` more of them (below the goal) for no
    more accelerators."""
    ttft = spec.targets.ttft_ms
    p, d = counts
    tps = {Role.PREFILL: pools.prefill_tp, Role.DECODE: pools.decode_tp}
    now = {Role.PREFILL: p, Role.DECODE: d}
    # the TTFT target alone (a run's ``attained`` counts the gap target too)
    ttft_only = RunSpec(spec.shape, spec.routing, Goals(ttft, math.inf), spec.context,
                        spec.rate_scale)
    done: dict[tuple[Role, int, int], TpTrial] = {}  # every trial, in the order played

    def trial(role: Role, tp: int, count: int) -> TpTrial:
        if (role, tp, count) in done:
            return done[(role, tp, count)]
        layout_tp, layout_n = dict(tps), dict(now)
        layout_tp[role], layout_n[role] = tp, count
        layout = Layout(layout_n[Role.DECODE], layout_tp[Role.DECODE],
                        layout_n[Role.PREFILL], layout_tp[Role.PREFILL],
                        spec.routing.disagg_policy)
        share = simulate(recent, layout, ttft_only).attained
        done[(role, tp, count)] = t = TpTrial(role.value, tp, count, layout.accelerators, share)
        return t

    base = trial(Role.DECODE, tps[Role.DECODE], d)
    reasons = [f"TP: {p} x TP{pools.prefill_tp} prefill + {d} x TP{pools.decode_tp} decode "
               f"keep {base.share:.1%} of {len(recent)} recent requests within {ttft:.0f} ms "
               f"on {base.accelerators} accelerators"]
    candidates: list[TpTrial] = []
    for role in Role:
        if now[role] == 0:
            continue  # colocated: no prefill pool to size
        for tp in sorted(set(valid.get(role, ())) - {tps[role]}):
            same = max(1, math.ceil(now[role] * tps[role] / tp))
            for count in dict.fromkeys(c for c in (same, same - 1) if c >= 1):
                t = trial(role, tp, count)
                # the pool's TP now, on as many of its accelerators as the candidate's
                peer = trial(role, tps[role], max(1, math.ceil(count * tp / tps[role])))
                if _worth(t, peer, base, goal, gain):
                    candidates.append(t)
    tp_out = {r.value: tps[r] for r in Role}
    n_out = {r.value: now[r] for r in Role}
    if not candidates:
        reasons.append("TP: no other TP of either pool does better on this traffic")
        return TpAdvice(None, tp_out, n_out, tuple(done.values()), tuple(reasons))
    best = min(candidates, key=lambda t: (0, t.accelerators, -t.share) if t.share >= goal
               else (1, -t.share, t.accelerators))
    tp_out[best.role], n_out[best.role] = best.tp, best.count
    reasons.append(f"TP: recommend {best.role} {best.count} x TP{best.tp}: {best.share:.1%} "
                   f"within target on {best.accelerators} accelerators (now TP"
                   f"{tps[Role(best.role)]}: {base.share:.1%} on {base.accelerators}); "
                   "review and confirm it -- the planner never changes a TP itself")
    return TpAdvice(best.role, tp_out, n_out, tuple(done.values()), tuple(reasons))


def _worth(t: TpTrial, peer: TpTrial, base: TpTrial, goal: float, gain: float) -> bool:
    """``t`` is worth a rolling replacement of its pool against ``peer``, the pool's TP now
    on as many accelerators: within the goal for fewer accelerators, or where the peer misses
    it; both below the goal, ``gain`` more requests within the target for no more. Never
    more accelerators than the recommended sizes take where those meet the goal."""
    if base.share >= goal and t.accelerators > base.accelerators:
        return False
    if t.share >= goal:
        return t.accelerators < peer.accelerators or peer.share < goal
    return peer.share < goal and t.accelerators <= peer.accelerators and \
        t.share >= peer.share + gain
