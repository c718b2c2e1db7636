"""Performance profiles: what one engine of a (model, accelerator, TP) configuration does,
measured by ``pdctl profile`` and read by the planner.

A profile holds two sweeps: prefill (a prompt of N tokens alone on the engine: its TTFT and
prompt tokens per second) and decode (C sequences of context K decoding together: the
inter-token latency and output tokens per second of the engine). Times are in *modelled*
milliseconds: a simulated engine run at ``time_scale`` s is measured in wall time and divided
by s, so a profile does not depend on how fast the simulation ran.

Files are JSON, one per configuration, named ``{engine}-{model}-{accelerator}-tp{N}.json``;
the shipped ones live beside this module, and ``planner.profile_dir`` adds more (its files
win)."""

from __future__ import annotations

import bisect
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).with_name("profiles")
FORMAT = 1


@dataclass(frozen=True)
class PrefillPoint:
    prompt_tokens: int
    ttft_ms: float
    tokens_per_s: float


@dataclass(frozen=True)
class DecodePoint:
    concurrency: int
    context_tokens: int
    itl_ms: float
    tokens_per_s: float  # output tokens per second of the whole engine


@dataclass(frozen=True)
class DecodeChoice:
    """The best decode operating point under an ITL budget at one context length."""

    concurrency: int
    itl_ms: float
    tokens_per_s: float
    kv_bound: bool  # the KV cache, not the ITL budget, capped the concurrency


@dataclass(frozen=True)
class PerfProfile:
    engine: str  # sim | vllm
    model: str
    accelerator: str
    tp: int
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]
    kv_capacity_tokens: int | None = None  # KV cache tokens one instance holds
    source: str = ""  # how it was measured (command, date)

    @property
    def key(self) -> str:
        return profile_key(self.engine, self.model, self.accelerator, self.tp)

    # ---- prefill -------------------------------------------------------------------------

    def prefill_at(self, prompt_tokens: float) -> tuple[float, float]:
        """(TTFT ms, prompt tokens/s) of one instance at this prompt length: linear between
        the measured lengths, the nearest end outside them."""
        pts = sorted(self.prefill, key=lambda p: p.prompt_tokens)
        xs = [p.prompt_tokens for p in pts]
        return (_interp(xs, [p.ttft_ms for p in pts], prompt_tokens),
                _interp(xs, [p.tokens_per_s for p in pts], prompt_tokens))

    # ---- decode --------------------------------------------------------------------------

    def contexts(self) -> list[int]:
        return sorted({p.context_tokens for p in self.decode})

    def _row(self, context: int) -> list[DecodePoint]:
        return sorted((p for p in self.decode if p.context_tokens == context),
                      key=lambda p: p.concurrency)

    def decode_itl_at(self, concurrency: float, context_tokens: float) -> float:
        """Profiled ITL (ms) at this concurrency and context: linear in both."""
        ctxs = self.contexts()
        lo, hi = _bracket(ctxs, context_tokens)
        at = [_interp([p.concurrency for p in self._row(c)], [p.itl_ms for p in self._row(c)],
                      concurrency) for c in (lo, hi)]
        return _blend(lo, hi, at[0], at[1], context_tokens)

    def decode_best(self, context_tokens: float, itl_budget_ms: float) -> DecodeChoice | None:
        """The highest-throughput concurrency whose ITL stays within ``itl_budget_ms`` and
        whose sequences fit the KV cache, at this context length. Candidates: the measured
        concurrencies up to the largest both measured contexts around it reached (and the KV
        cache's own limit), their ITL linear in concurrency and context; None when not even
        one sequence meets the budget."""
        lo, hi = _bracket(self.contexts(), context_tokens)
        top = min(self._row(lo)[-1].concurrency, self._row(hi)[-1].concurrency)
        kv_cap = (self.kv_capacity_tokens // max(1, int(context_tokens))
                  if self.kv_capacity_tokens else None)
        cands = {p.concurrency for c in (lo, hi) for p in self._row(c) if p.concurrency <= top}
        if kv_cap is not None and 1 <= kv_cap <= top:
            cands.add(kv_cap)
        best: DecodeChoice | None = None
        kv_bound = False
        for c in sorted(cands):
            if kv_cap is not None and c > kv_cap:
                kv_bound = True
                continue
            itl = self.decode_itl_at(c, context_tokens)
            if itl > itl_budget_ms:
                continue
            tps = c * 1e3 / itl
            if best is None or tps > best.tokens_per_s:
                best = DecodeChoice(c, itl, tps, False)
        if best is not None and kv_bound:
            best = DecodeChoice(best.concurrency, best.itl_ms, best.tokens_per_s, True)
        return best

    # ---- files ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["format"] = FORMAT
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PerfProfile:
        if data.get("format") != FORMAT:
            raise ValueError(f"profile format {data.get('format')!r}, expected {FORMAT}")
        prefill = tuple(PrefillPoint(**p) for p in data["prefill"])
        decode = tuple(DecodePoint(**p) for p in data["decode"])
        if not prefill or not decode:
            raise ValueError("a profile needs prefill and decode points")
        return cls(engine=str(data["engine"]), model=str(data["model"]),
                   accelerator=str(data["accelerator"]), tp=int(data["tp"]),
                   prefill=prefill, decode=decode,
                   kv_capacity_tokens=data.get("kv_capacity_tokens"),
                   source=str(data.get("source", "")))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")


def profile_key(engine: str, model: str, accelerator: str, tp: int) -> str:
    return f"{engine}-{model}-{accelerator}-tp{tp}"


def load(path: Path) -> PerfProfile:
    try:
        return PerfProfile.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"profile {path}: {exc}") from None


class ProfileIndex:
    """The profiles the planner may use: the shipped ones, then ``extra`` (which win)."""

    def __init__(self, extra: Path | None = None) -> None:
        self.dirs = [SHIPPED] + ([extra] if extra is not None else [])

    def find(self, engine: str, model: str, accelerator: str, tp: int) -> PerfProfile | None:
        name = profile_key(engine, model, accelerator, tp) + ".json"
        for d in reversed(self.dirs):
            if (d / name).is_file():
                return load(d / name)
        return None

    def known(self) -> list[str]:
        return sorted({p.stem for d in self.dirs if d.is_dir() for p in d.glob("*.json")})


# ---- interpolation -----------------------------------------------------------------------

def _interp(xs: list[int], ys: list[float], x: float) -> float:
    if not xs:
        raise ValueError("no points")
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    k = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _bracket(xs: list[int], x: float) -> tuple[int, int]:
    """The measured values around ``x`` (both the nearest end outside them)."""
    if x <= xs[0]:
        return xs[0], xs[0]
    if x >= xs[-1]:
        return xs[-1], xs[-1]
    k = bisect.bisect_left(xs, x)
    return (xs[k], xs[k]) if xs[k] == x else (xs[k - 1], xs[k])


def _blend(lo: int, hi: int, ylo: float, yhi: float, x: float) -> float:
    return ylo if hi == lo else ylo + (yhi - ylo) * (x - lo) / (hi - lo)
