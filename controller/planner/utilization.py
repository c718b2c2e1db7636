"""Load against capacity, bucket by bucket (``/api/v1/utilization``): pure functions from the
engines' load polls, the finished requests and the performance profiles to each instance's and
each pool's series. No clock, no I/O: tests assert them from tables.

- Buckets are ``requests_log.timeseries``'s: ``n = ceil(window / step)`` buckets of ``step``
  ending at ``now``.
- Engine load: the mean of the polls in a bucket (``None`` where none).
- Tokens: a prompt counts on the instance that computed it -- the prefill instance of a
  disaggregated request, the decode instance of a colocated one -- when its prefill ended
  (start + queue + prefill); the output tokens on the decode instance, spread evenly from the
  first token to the end.
- Capacity per (role, TP) (``capacity``), from the planner's profile as the planner sizes pools
  (``decide.size_prefill``/``size_decode``): prompt tokens/s at the window's mean prompt
  length, and output tokens/s of the best concurrency whose ITL meets the planner's target at
  the window's mean context (prompt + half the output), the KV cache's room included.
- Utilization = rate / capacity in one clock: a scaled simulation's wall rates are multiplied
  by ``time_scale`` (modelled), as profiles are modelled. A decode instance's colocated prompts
  add their share of its prompt capacity to its output share.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from controller.fleet.history import LoadSamples
from controller.models import RequestPath, RequestRecord, Role
from controller.planner.capacity import CapacityOf, TokenCapacity
from controller.requests_log import bucket_grid
from controller.sizing.advisor import DEFAULT_ISL, DEFAULT_OSL

LOOKBACK_S = 600.0  # requests started this long before the window may still add tokens to it
NAN = float("nan")


# ---- tokens ------------------------------------------------------------------------------


NUMBERS = ("started_at", "queue_ms", "prefill_ms", "ttft_ms", "e2e_ms", "prompt_tokens",
           "output_tokens")  # what a record's tokens and their times are read from
_NUMBERS = attrgetter(*NUMBERS)
_PREFILL, _DECODE, _PATH = (attrgetter("prefill_instance"), attrgetter("decode_instance"),
                            attrgetter("path"))
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class TokenWork:
    """The tokens of finished requests, as work done by instances (wall unix s): each prompt
    at one time on one instance, each answer's output tokens over a span on another.
    ``prompt_on``/``output_on`` index ``ids``."""

    ids: tuple[str, ...]
    prompt_on: np.ndarray
    prompt_at: np.ndarray
    prompt_n: np.ndarray
    colocated: np.ndarray  # the prompt was computed by a decode instance
    output_on: np.ndarray
    output_from: np.ndarray
    output_to: np.ndarray
    output_n: np.ndarray
    output_context: np.ndarray  # prompt + half the output: the decode's mean context

    @classmethod
    def of(cls, records: Iterable[RequestRecord], numbers: np.ndarray | None = None
           ) -> TokenWork:
        """Columns first, then numpy: 100k records in tens of milliseconds. ``numbers``: the
        records' ``NUMBERS`` columns where the caller has them already (the request log's)."""
        recs = list(records)
        v = numbers if numbers is not None and numbers.shape == (len(recs), len(NUMBERS)) \
            else np.fromiter(chain.from_iterable(map(_NUMBERS, recs)), float,
                             count=len(NUMBERS) * len(recs)).reshape(-1, len(NUMBERS))
        pre_ids, dec_ids = list(map(_PREFILL, recs)), list(map(_DECODE, recs))
        ids = tuple(k for k in dict.fromkeys(chain(pre_ids, dec_ids)) if k is not None)
        code: dict[str | None, int] = {None: -1, **{k: n for n, k in enumerate(ids)}}
        pre = np.fromiter(map(code.__getitem__, pre_ids), np.int64, count=len(recs))
        dec = np.fromiter(map(code.__getitem__, dec_ids), np.int64, count=len(recs))
        coloc = np.fromiter(map(RequestPath.COLOCATED.__eq__, map(_PATH, recs)), bool,
                            count=len(recs))
        start, prompt, output = v[:, 0], v[:, 5], v[:, 6]
        on = np.where(coloc, dec, pre)
        p = (on >= 0) & (prompt > 0)
        o = (dec >= 0) & (output > 0)
        return cls(ids, on[p],
                   start[p] + (v[p, 1] + v[p, 2]) / 1e3, prompt[p], coloc[p], dec[o],
                   start[o] + v[o, 3] / 1e3, start[o] + v[o, 4] / 1e3, output[o],
                   prompt[o] + output[o] / 2)

    def named(self, codes: np.ndarray) -> list[str]:
        return [self.ids[c] for c in codes.tolist()]


def _groups(codes: np.ndarray) -> dict[int, np.ndarray]:
    """Row indices of each code."""
    order = np.argsort(codes, kind="stable")
    uniq, first = np.unique(codes[order], return_index=True)
    bounds = [*first.tolist(), len(order)]
    return {int(c): order[bounds[k]:bounds[k + 1]] for k, c in enumerate(uniq.tolist())}


def bucket_of(at: np.ndarray, start: float, step: float, n: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """``(bucket of each time within the buckets, which times are)``; safe for any step
    (a step of 1e-300 overflows a division to inf, which no cast may meet)."""
    with np.errstate(all="ignore"):
        rel = (at - start) / step
    ok = (rel >= 0) & (rel < n)
    return np.minimum(np.floor(rel[ok]).astype(np.int64), n - 1), ok


def _buckets_of(at: np.ndarray, amount: np.ndarray, start: float, step: float, n: int
                ) -> np.ndarray:
    k, ok = bucket_of(at, start, step, n)
    return np.bincount(k, weights=amount[ok], minlength=n)[:n].astype(float)


def _ramps(x: np.ndarray, w: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``sum_i w_i * max(0, e - x_i)`` at each edge ``e``."""
    order = np.argsort(x, kind="stable")
    xs, ws = x[order], w[order]
    cw = np.concatenate([[0.0], np.cumsum(ws)])
    cwx = np.concatenate([[0.0], np.cumsum(ws * xs)])
    k = np.searchsorted(xs, edges, side="left")
    return edges * cw[k] - cwx[k]


def spread(lo: np.ndarray, hi: np.ndarray, amount: np.ndarray, start: float, step: float,
           n: int) -> np.ndarray:
    """Each ``amount`` spread evenly over ``[lo, hi)``, summed per bucket; an empty span
    lands whole in the bucket of ``lo``; what falls outside the buckets is dropped."""
    out = np.zeros(n)
    point = hi <= lo
    if point.any():
        out += _buckets_of(lo[point], amount[point], start, step, n)
    span = ~point
    if span.any():
        a, b = lo[span] - start, hi[span] - start  # near zero: no precision lost to 1.7e9
        w = amount[span] / (b - a)
        edges = step * np.arange(n + 1, dtype=float)
        out += np.diff(_ramps(a, w, edges) - _ramps(b, w, edges))
    return out


def _mean(values: np.ndarray, default: float) -> float:
    return float(values.mean()) if values.size else default


# ---- the series --------------------------------------------------------------------------


@dataclass
class _Line:
    """One instance's series (numpy, NaN for None) and capacity."""

    id: str
    role: Role
    tp: int | None
    capacity: TokenCapacity
    samples: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    kv: np.ndarray
    prompt: np.ndarray  # tokens/s in the answer's clock; NaN: not active in the bucket
    output: np.ndarray
    utilization: np.ndarray


def _cap(c: float | None) -> float:
    return c if c is not None and c > 0 else NAN


def _share_of_capacity(role: Role, prompt: np.ndarray, output: np.ndarray, cap: TokenCapacity
                 ) -> np.ndarray:
    u = prompt / _cap(cap.prompt_tokens_per_s)
    return u if role is Role.PREFILL else u + output / _cap(cap.output_tokens_per_s)


def _listed(a: np.ndarray) -> list[float | None]:
    return [float(x) if math.isfinite(x) else None for x in a.tolist()]


def _series(samples: np.ndarray, running: np.ndarray, waiting: np.ndarray, kv: np.ndarray,
            prompt: np.ndarray, output: np.ndarray, util: np.ndarray) -> dict[str, Any]:
    return {"samples": [int(x) for x in samples.tolist()], "running": _listed(running),
            "waiting": _listed(waiting), "kv_cache_usage": _listed(kv),
            "prompt_tokens_per_s": _listed(prompt), "output_tokens_per_s": _listed(output),
            "utilization": _listed(util)}


def _where(mask: Any, values: Any) -> np.ndarray:
    return np.where(mask, values, NAN)


def _pool(role: Role, lines: list[_Line], n: int) -> dict[str, Any]:
    """A pool's sums (running, waiting, rates), mean KV usage, and utilization as its
    instances' summed rates over their summed capacity (those with a profile)."""
    if not lines:
        empty = np.full(n, NAN)
        return {"role": role, "work": "prompt" if role is Role.PREFILL else "output",
                "instances": [0] * n, "capacity_tokens_per_s": [None] * n,
                "series": _series(np.zeros(n), *([empty] * 6)), "window": {},
                "reason": "no instance in the window"}
    stack = {f: np.vstack([getattr(x, f) for x in lines])
             for f in ("samples", "running", "waiting", "kv", "prompt", "output")}
    polled = stack["samples"] > 0
    active = ~np.isnan(stack["prompt"])
    any_polled, any_active = polled.any(axis=0), active.any(axis=0)
    pcap = np.array([_cap(x.capacity.prompt_tokens_per_s) for x in lines])[:, None]
    ocap = np.array([_cap(x.capacity.output_tokens_per_s) for x in lines])[:, None]
    primary = pcap if role is Role.PREFILL else ocap
    counted = active & ~np.isnan(primary)
    any_counted = counted.any(axis=0)
    p_sum = np.where(active, stack["prompt"], 0.0).sum(axis=0)
    o_sum = np.where(active, stack["output"], 0.0).sum(axis=0)
    p_counted = np.where(counted, stack["prompt"], 0.0).sum(axis=0)
    o_counted = np.where(counted, stack["output"], 0.0).sum(axis=0)
    pc = np.where(counted, pcap, 0.0).sum(axis=0)
    oc = np.where(counted, ocap, 0.0).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        util = p_counted / pc if role is Role.PREFILL else o_counted / oc + np.where(
            p_counted > 0, p_counted / pc, 0.0)
        kv = np.where(polled, stack["kv"], 0.0).sum(axis=0) / polled.sum(axis=0)
    series = _series(polled.sum(axis=0), _where(any_polled, np.nansum(stack["running"], 0)),
                     _where(any_polled, np.nansum(stack["waiting"], 0)), _where(any_polled, kv),
                     _where(any_active, p_sum), _where(any_active, o_sum),
                     _where(any_counted, util))
    capacity = _where(any_counted, pc if role is Role.PREFILL else oc)
    without = np.isnan(primary[:, 0])
    lacking = sorted({x.capacity.reason or "no profile" for x, w in zip(lines, without,
                                                                         strict=True) if w})
    reason = None
    if lacking:
        who = ("no instance of it has" if without.all()
               else f"{int(without.sum())} of its instances (left out) have")
        reason = f"{who} a capacity: {'; '.join(lacking)}"
    window = {"running": _nanmean(series["running"]), "waiting": _nanmean(series["waiting"]),
              "kv_cache_usage": _nanmean(series["kv_cache_usage"]),
              "prompt_tokens_per_s": _nanmean(series["prompt_tokens_per_s"]),
              "output_tokens_per_s": _nanmean(series["output_tokens_per_s"]),
              "utilization": _overall(role, p_counted, o_counted, pc, oc, any_counted)}
    return {"role": role, "work": "prompt" if role is Role.PREFILL else "output",
            "instances": [int(x) for x in active.sum(axis=0).tolist()],
            "capacity_tokens_per_s": _listed(capacity), "series": series, "window": window,
            "reason": reason}


def _nanmean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def _overall(role: Role, p: np.ndarray, o: np.ndarray, pc: np.ndarray, oc: np.ndarray,
             counted: np.ndarray) -> float | None:
    """All the tokens over all the capacity of the buckets it had any."""
    if not counted.any():
        return None
    pc_sum, oc_sum = float(pc[counted].sum()), float(oc[counted].sum())
    u = float(p[counted].sum()) / pc_sum if pc_sum > 0 else 0.0
    if role is Role.DECODE:
        u = (float(o[counted].sum()) / oc_sum if oc_sum > 0 else 0.0) + (
            u if float(p[counted].sum()) > 0 else 0.0)
    return u


@dataclass(frozen=True)
class Seen:
    """An instance as the answer names it: its role, TP (None: unknown) and state now."""

    role: Role
    tp: int | None
    state: str | None = None


def instance_lines(samples: LoadSamples, work: TokenWork, seen: Mapping[str, Seen],
                   capacity: CapacityOf, start: float, step_s: float, n: int,
                   time_scale: float
                   ) -> tuple[list[dict[str, Any]], dict[Role, dict[str, Any]]]:
    """``(instances, pools)`` of the answer; ``capacity(role, tp, prompt tokens, context
    tokens)`` gives an instance's capacity at the window's mean lengths."""
    end = start + n * step_s
    k, ok = bucket_of(samples.t, start, step_s, n)
    code = samples.inst[ok]
    cells = len(samples.ids) * n
    flat = code.astype(np.int64) * n + k

    def per_cell(values: np.ndarray) -> np.ndarray:
        return np.bincount(flat, weights=values, minlength=cells).reshape(-1, n)

    counts = per_cell(np.ones(k.shape[0]))
    sums = [per_cell(v[ok]) for v in (samples.running, samples.waiting, samples.kv_usage)]
    p_in = (work.prompt_at >= start) & (work.prompt_at < end)
    o_in = (work.output_to >= start) & (work.output_from < end)
    prompt_len = {c: _mean(work.prompt_n[p_in & (work.colocated == c)], DEFAULT_ISL)
                  for c in (False, True)}
    context = _mean(work.output_context[o_in], DEFAULT_ISL + DEFAULT_OSL / 2)
    ids = [i for i, c in zip(samples.ids, counts.sum(axis=1), strict=True) if c > 0]
    ids += sorted({*work.named(work.prompt_on[p_in]), *work.named(work.output_on[o_in])}
                  - set(ids))
    prefilled = set(work.named(work.prompt_on[p_in & ~work.colocated]))
    work_code = {iid: k for k, iid in enumerate(work.ids)}
    by_p, by_o = _groups(work.prompt_on), _groups(work.output_on)
    rows = {iid: k for k, iid in enumerate(samples.ids)}
    caps: dict[tuple[Role, int | None], TokenCapacity] = {}
    lines = []
    for iid in ids:
        s = seen.get(iid) or Seen(Role.PREFILL if iid in prefilled else Role.DECODE, None)
        key = (s.role, s.tp)
        if key not in caps:
            caps[key] = capacity(s.role, s.tp, prompt_len[s.role is Role.DECODE], context)
        row = rows.get(iid)
        cnt = counts[row] if row is not None else np.zeros(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            means = [(x[row] if row is not None else np.zeros(n)) / cnt for x in sums]
        pm = by_p.get(work_code.get(iid, -1), _EMPTY)
        om = by_o.get(work_code.get(iid, -1), _EMPTY)
        prompt = _buckets_of(work.prompt_at[pm], work.prompt_n[pm], start, step_s, n)
        output = spread(work.output_from[om], work.output_to[om], work.output_n[om], start,
                        step_s, n)
        active = (cnt > 0) | (prompt > 0) | (output > 0)
        rate = time_scale / step_s
        p_rate, o_rate = _where(active, prompt * rate), _where(active, output * rate)
        polled = cnt > 0
        lines.append(_Line(iid, s.role, s.tp, caps[key], cnt, _where(polled, means[0]),
                           _where(polled, means[1]), _where(polled, means[2]), p_rate, o_rate,
                           _share_of_capacity(s.role, p_rate, o_rate, caps[key])))
    instances = [{"id": x.id, "role": x.role, "tp": x.tp, "state": seen[x.id].state
                  if x.id in seen else None, "capacity": x.capacity.public(),
                  "series": _series(x.samples, x.running, x.waiting, x.kv, x.prompt, x.output,
                                    x.utilization)}
                 for x in sorted(lines, key=lambda x: (x.role is Role.DECODE, _id_order(x.id)))]
    pools = {r: _pool(r, [x for x in lines if x.role is r], n) for r in Role}
    return instances, pools


def _id_order(iid: str) -> tuple[str, int]:
    """``decode-10`` after ``decode-9``."""
    name, _, num = iid.rpartition("-")
    return (name, int(num)) if num.isdigit() else (iid, 0)


def utilization_json(samples: LoadSamples, records: Iterable[RequestRecord] | TokenWork,
                     seen: Mapping[str, Seen], capacity: CapacityOf, window_s: float,
                     step_s: float, now: float, time_scale: float, itl_ms: float
                     ) -> dict[str, Any]:
    """The whole answer of ``/api/v1/utilization`` (``UtilizationPublic``'s fields)."""
    start, n = bucket_grid(window_s, step_s, now)
    work = records if isinstance(records, TokenWork) else TokenWork.of(records)
    instances, pools = instance_lines(samples, work, seen, capacity, start, step_s, n,
                                      time_scale)
    modelled = time_scale != 1.0
    clock = "modelled" if modelled else "wall"
    return {
        "window_s": window_s, "step_s": step_s, "now": now,
        "t": [start + b * step_s for b in range(n)], "clock": clock, "time_scale": time_scale,
        "itl_target_ms": itl_ms,
        "basis": ("engine load: the mean of the controller's polls of each engine's /metrics "
                  "in a bucket; tokens: finished requests' (a prompt on the instance that "
                  "computed it when its prefill ended, output tokens on the decode instance "
                  "spread over its decode; requests still running are not counted yet); "
                  "utilization: token rate / the planner's profiled capacity, both in "
                  + (f"modelled time (wall rates x time_scale {time_scale:g})" if modelled
                     else "wall time")),
        "instances": instances, "pools": pools,
    }
