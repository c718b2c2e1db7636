"""The hand-off decision (``controller.router.handoff``), table-driven: the threshold rule and
the ``slo`` decision over cached prefixes, queues, the TTFT deficit, the gap guard and ties;
and the rates it learns from finished requests."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.models import RequestPath, RequestRecord
from controller.router import handoff
from controller.router.handoff_rates import MIN_FOR_P95, HandoffRates, Prior

# A 4,000-token prompt on an idle fleet, both pools 0.1 ms/token, 0.01 ms/token to move.
BASE = handoff.Inputs(
    prompt_tokens=4000, prefill_ready=True, prefill_uncached=4000, prefill_queued=0,
    decode_uncached=4000, decode_queued=0, decode_running=0, prefill_ms_per_token=0.1,
    local_ms_per_token=0.1, transfer_ms=40.0, hop_ms=5.0, chunk_tokens=2048,
    ttft_target_ms=2000.0, gap_target_ms=100.0)


@pytest.mark.parametrize(("tokens", "threshold", "ready", "disagg", "words"), [
    (100, 512, True, False, "100 prompt tokens < 512"),
    (512, 512, True, True, "512 prompt tokens >= 512"),
    (9000, 512, False, False, "no ready prefill instance"),
    (0, 0, True, True, ">= 0"),
])
def test_threshold(tokens: int, threshold: int, ready: bool, disagg: bool, words: str) -> None:
    d = handoff.by_threshold(tokens, threshold, ready)
    assert d.disaggregated is disagg and words in d.reason
    assert d.name == ("disaggregated" if disagg else "local")


CASES = [
    # (case, changes, disaggregated, words in the reason)
    ("idle fleet, no streams: local is faster (no transfer, no second hop)",
     {}, False, "local ~400 ms, disaggregated ~445 ms"),
    ("no prefill instance", {"prefill_ready": False}, False, "no ready prefill instance"),
    ("decode instance holds all but the last token", {"decode_uncached": 1}, False,
     "decode instance holds the prompt"),
    ("prompt cached on prefill only: disaggregated is cheaper",
     {"prefill_uncached": 200, "transfer_ms": 40.0}, True, "disaggregated ~65 ms"),
    ("11k of 12k cached on decode: a short prompt, served locally, although its streams",
     {"prompt_tokens": 12000, "prefill_uncached": 12000, "decode_uncached": 1000,
      "decode_running": 8, "transfer_ms": 10.0}, False, "local ~100 ms"),
    ("decode instance busy prefilling others: disaggregated",
     {"decode_queued": 5000}, True, "local ~900 ms, disaggregated ~505 ms"),
    ("its queued prefills delay the disaggregated first token too: no clear gain, local",
     {"decode_queued": 20000}, False, "local ~2,400 ms, disaggregated ~2,005 ms"),
    ("a gain under 20 % is not worth the second hop",
     {"decode_queued": 1000}, False, "local ~500 ms, disaggregated ~445 ms"),
    ("prefill pool backlogged: local",
     {"prefill_queued": 30000, "decode_running": 3}, False,
     "disaggregated would miss the 2,000 ms TTFT target"),
    ("gap guard: local faster, but it would stall running streams past the gap target",
     {"decode_running": 5}, True, "would stall 5 streams ~205 ms"),
    ("gap guard: not at more than 1.5x the local TTFT",
     {"decode_running": 5, "transfer_ms": 300.0}, False,
     "but disaggregated would cost over 1.5x the local TTFT"),
    ("gap guard off when the stall fits the gap target",
     {"decode_running": 5, "gap_target_ms": 500.0}, False, "local ~400 ms"),
    ("gap guard yields to a TTFT deficit",
     {"decode_running": 5, "ttft_recent_ms": 2500.0}, False,
     "TTFT p95 2,500 ms is over its 2,000 ms target"),
    ("no deficit: the guard holds",
     {"decode_running": 5, "ttft_recent_ms": 1500.0}, True, "would stall"),
    ("the stall is one chunk, not the whole prompt",
     {"decode_running": 2, "chunk_tokens": 512, "gap_target_ms": 60.0}, False,
     "local ~400 ms"),
    ("tie: local (one engine, no KV moved)",
     {"transfer_ms": 0.0, "hop_ms": 0.0}, False, "local ~400 ms, disaggregated ~400 ms"),
    ("a slower prefill pool (TP smaller)",
     {"prefill_ms_per_token": 0.3}, False, "disaggregated ~1,245 ms"),
    ("a slow link: KV transfer outweighs the saved prefill",
     {"decode_queued": 2000, "transfer_ms": 500.0}, False, "local ~600 ms"),
]


@pytest.mark.parametrize(("case", "changes", "disagg", "words"), CASES,
                         ids=[c[0] for c in CASES])
def test_slo(case: str, changes: dict[str, object], disagg: bool, words: str) -> None:
    d = handoff.by_slo(replace(BASE, **changes))  # type: ignore[arg-type]
    assert d.disaggregated is disagg, d.reason
    assert words in d.reason, d.reason


def test_slo_reports_its_estimates() -> None:
    d = handoff.by_slo(replace(BASE, decode_queued=5000))
    assert d.local_ms == pytest.approx(900.0)
    assert d.disagg_ms == pytest.approx(505.0)


def _rec(path: RequestPath, prompt: int, prefill_ms: float, cached: int = 0,
         transfer_ms: float = 0.0, ttft_ms: float = 100.0, status: str = "ok"
         ) -> RequestRecord:
    disagg = path is RequestPath.DISAGGREGATED
    return RequestRecord(
        id="r", started_at=0.0, endpoint="/v1/completions", path=path, status=status,
        stream=False, prompt_tokens=prompt, output_tokens=4,
        prefill_instance="prefill-0" if disagg else None, decode_instance="decode-0",
        prefill_ms=prefill_ms, transfer_ms=transfer_ms, ttft_ms=ttft_ms, cached_tokens=cached)


def test_rates_learn_each_pool_from_its_own_requests() -> None:
    r = HandoffRates(Prior(1.0, 1.0, 0.1, hop_ms=2.0))
    for _ in range(100):
        r.observe(_rec(RequestPath.DISAGGREGATED, 2000, 200.0, cached=1000, transfer_ms=20.0))
        r.observe(_rec(RequestPath.COLOCATED, 1000, 300.0))
    assert r.prefill_ms_per_token == pytest.approx(0.2, rel=1e-3)  # 200 ms / 1000 uncached
    assert r.local_ms_per_token == pytest.approx(0.3, rel=1e-3)
    assert r.transfer_ms_per_token == pytest.approx(0.01, rel=1e-3)  # 20 ms / 2000 moved


def test_rates_ignore_failures_and_tiny_prompts() -> None:
    r = HandoffRates(Prior(1.0, 1.0, 0.1))
    r.observe(_rec(RequestPath.COLOCATED, 1000, 5000.0, status="error"))
    r.observe(_rec(RequestPath.COLOCATED, 4, 5000.0))
    assert r.local_ms_per_token == 1.0


def test_ttft_p95_needs_enough_requests() -> None:
    r = HandoffRates(Prior(1.0, 1.0, 0.1))
    for k in range(MIN_FOR_P95 - 1):
        r.observe(_rec(RequestPath.COLOCATED, 1000, 100.0, ttft_ms=float(k)))
    assert r.ttft_p95() is None
    for _ in range(100):
        r.observe(_rec(RequestPath.COLOCATED, 1000, 100.0, ttft_ms=1000.0))
    assert r.ttft_p95() == pytest.approx(1000.0)
