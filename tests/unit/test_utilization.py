"""Load against capacity (``controller.planner.utilization``, ``controller.fleet.history``):
the buckets, where each token counts and when, a replaced instance as its own line, the
capacity and its basis from a profile, the modelled clock, the pools' sums, and the polls
kept in a bounded ring. Decisions as data: tables in, values out."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from controller.config import load_settings
from controller.fleet import build_fleet
from controller.fleet.history import LoadHistory, LoadSamples
from controller.models import Instance, InstanceState, RequestPath, RequestRecord, Role
from controller.planner.capacity import profile_capacities, profile_capacity
from controller.planner.profile import DecodePoint, PerfProfile, PrefillPoint, ProfileIndex
from controller.planner.utilization import (
    Seen,
    TokenWork,
    instance_lines,
    spread,
    utilization_json,
)
from controller.requests_log import bucket_grid, timeseries
from controller.store import Store
from tests.unit.api_app import NoLauncher

# One instance prefills 10,000 prompt tokens/s at 1,000-token prompts; decoding 1,000-token
# contexts, 10 sequences at 20 ms ITL (500 tokens/s) is the best within a 50 ms target.
PROFILE = PerfProfile(
    "sim", "m", "acc", 2, (PrefillPoint(1000, 100.0, 10_000.0),),
    (DecodePoint(1, 1000, 10.0, 100.0), DecodePoint(10, 1000, 20.0, 500.0),
     DecodePoint(50, 1000, 100.0, 500.0)))
CAPACITY = profile_capacities(lambda tp: PROFILE if tp == 2 else None,
                              lambda tp: f"sim-m-acc-tp{tp}", 50.0)
SEEN = {"prefill-1": Seen(Role.PREFILL, 2, "ready"), "decode-2": Seen(Role.DECODE, 2, "stopped"),
        "decode-3": Seen(Role.DECODE, 2, "ready"), "decode-4": Seen(Role.DECODE, 4, "ready")}


def request(k: int, started: float, prefill: str | None, decode: str = "decode-3",
            prompt: int = 1000, output: int = 100, e2e_ms: float = 10_000.0) -> RequestRecord:
    """A request whose prefill ends 1 s after it started and whose first token comes 2 s
    after, and which ends ``e2e_ms`` after it started."""
    return RequestRecord(f"r{k}", started, "/v1/completions",
                         RequestPath.DISAGGREGATED if prefill else RequestPath.COLOCATED,
                         "ok", True, prompt, output, prefill, decode, queue_ms=400.0,
                         prefill_ms=600.0, ttft_ms=2000.0, e2e_ms=e2e_ms)


def polls(rows: dict[str, tuple[range, float]]) -> LoadSamples:
    """Each instance polled every second of its range with ``running`` = its value, waiting
    half that, KV usage a tenth."""
    return LoadSamples.of((float(t), iid, v, v / 2, v / 10) for iid, (ts, v) in rows.items()
                          for t in ts)


def lines(samples: LoadSamples, records: list[RequestRecord], now: float = 1020.0,
          window: float = 20.0, step: float = 5.0, scale: float = 1.0
          ) -> tuple[dict[str, dict], dict[Role, dict]]:
    start, n = bucket_grid(window, step, now)
    inst, pools = instance_lines(samples, TokenWork.of(records), SEEN, CAPACITY, start, step,
                                 n, scale)
    return {x["id"]: x for x in inst}, pools


def test_the_buckets_are_the_timeseries_buckets() -> None:
    for window, step, now in ((20.0, 5.0, 1020.0), (22.0, 5.0, 1020.0), (60.0, 7.0, 1e9)):
        start, n = bucket_grid(window, step, now)
        assert [start + k * step for k in range(n)] == [
            b["t"] for b in timeseries([], window, step, now)]


def test_tokens_spread_over_their_span_and_what_falls_outside_is_dropped() -> None:
    one = np.array([1.0])
    assert spread(one * 5, one * 15, one * 100, 0.0, 10.0, 2).tolist() == [50.0, 50.0]
    assert spread(one * -5, one * 5, one * 100, 0.0, 10.0, 2).tolist() == [50.0, 0.0]
    assert spread(one * 12, one * 12, one * 7, 0.0, 10.0, 2).tolist() == [0.0, 7.0]  # a point
    assert spread(one * 25, one * 25, one * 7, 0.0, 10.0, 2).tolist() == [0.0, 0.0]
    # At unix times, two spans summed: no precision lost to the 1.7e9 offset.
    t0 = 1.7e9
    out = spread(np.array([t0, t0 + 2]), np.array([t0 + 4, t0 + 3]), np.array([40.0, 10.0]),
                 t0, 2.0, 2)
    assert out == pytest.approx([20.0, 30.0], abs=1e-6)


def test_each_prompt_counts_on_the_instance_that_computed_it() -> None:
    work = TokenWork.of([request(0, 1000.0, "prefill-1"), request(1, 1000.0, None),
                         request(2, 1000.0, None, prompt=0, output=0),
                         RequestRecord("r3", 1000.0, "/v1/completions",
                                       RequestPath.DISAGGREGATED, "error", False, 900, 0, None,
                                       "decode-3")])  # its prefill never answered
    assert work.named(work.prompt_on) == ["prefill-1", "decode-3"]  # colocated: its decode's
    assert work.prompt_at.tolist() == [1001.0, 1001.0]  # when the prefill ended
    assert work.colocated.tolist() == [False, True]
    assert work.named(work.output_on) == ["decode-3", "decode-3"]
    assert work.output_from.tolist() == [1002.0, 1002.0]  # first token -> end
    assert work.output_to.tolist() == [1010.0, 1010.0]
    assert work.output_context.tolist() == [1050.0, 1050.0]


def test_a_replaced_instance_is_its_own_line_that_stops() -> None:
    """decode-2 polled for the first 10 s, its replacement decode-3 for the last 10."""
    by_id, pools = lines(polls({"decode-2": (range(1000, 1010), 2.0),
                                "decode-3": (range(1010, 1020), 4.0)}), [])
    old, new = by_id["decode-2"]["series"], by_id["decode-3"]["series"]
    assert old["running"] == [2.0, 2.0, None, None]
    assert new["running"] == [None, None, 4.0, 4.0]
    assert old["kv_cache_usage"] == pytest.approx([0.2, 0.2, None, None])
    assert old["samples"] == [5, 5, 0, 0]
    assert old["output_tokens_per_s"] == [0.0, 0.0, None, None]  # polled, no token: 0
    assert by_id["decode-2"]["state"] == "stopped"
    pool = pools[Role.DECODE]
    assert pool["series"]["running"] == [2.0, 2.0, 4.0, 4.0]
    assert pool["series"]["waiting"] == [1.0, 1.0, 2.0, 2.0]
    assert pool["instances"] == [1, 1, 1, 1]
    assert pool["capacity_tokens_per_s"] == [500.0] * 4
    assert pools[Role.PREFILL]["series"]["running"] == [None] * 4  # none in the window


def test_utilization_is_the_token_rate_over_the_profiles_capacity() -> None:
    """Prefill: 5 prompts of 1,000 tokens end in the first 5 s: 1,000 tokens/s, 10 % of
    10,000. Decode: 100 output tokens each over 8 s, 4,000 tokens/s at the top."""
    records = [request(k, 1000.0 + k * 0.5, "prefill-1", e2e_ms=10_000.0) for k in range(5)]
    by_id, pools = lines(polls({"prefill-1": (range(1000, 1020), 1.0),
                                "decode-3": (range(1000, 1020), 3.0)}), records)
    p = by_id["prefill-1"]
    assert p["series"]["prompt_tokens_per_s"] == [1000.0, 0.0, 0.0, 0.0]
    assert p["series"]["utilization"] == pytest.approx([0.1, 0.0, 0.0, 0.0])
    assert p["capacity"]["prompt_tokens_per_s"] == 10_000.0
    assert p["capacity"]["prompt_tokens"] == 1000.0
    d = by_id["decode-3"]["series"]
    assert sum(d["output_tokens_per_s"]) * 5.0 == pytest.approx(500.0)  # every token once
    assert d["utilization"] == pytest.approx([x / 500.0 for x in d["output_tokens_per_s"]])
    assert pools[Role.PREFILL]["window"]["utilization"] == pytest.approx(0.025)  # 5k / 200k
    assert pools[Role.DECODE]["window"]["utilization"] == pytest.approx(500 / (500 * 20))


def test_colocated_prompts_add_their_share_of_the_decode_instances_capacity() -> None:
    by_id, _ = lines(polls({"decode-3": (range(1000, 1020), 1.0)}),
                     [request(0, 1000.0, None, prompt=1000, output=0)])
    d = by_id["decode-3"]["series"]
    assert d["prompt_tokens_per_s"] == [200.0, 0.0, 0.0, 0.0]
    assert d["utilization"] == pytest.approx([0.02, 0.0, 0.0, 0.0])  # 200 / 10,000


def test_a_scaled_simulation_compares_in_modelled_time() -> None:
    """At time_scale 10 a wall second is a tenth of a modelled one: 1,000 wall tokens/s are
    10,000 modelled, 100 % of the modelled capacity."""
    records = [request(k, 1000.0, "prefill-1") for k in range(5)]
    samples = polls({"prefill-1": (range(1000, 1020), 1.0)})
    by_id, _ = lines(samples, records, scale=10.0)
    assert by_id["prefill-1"]["series"]["prompt_tokens_per_s"][0] == 10_000.0
    assert by_id["prefill-1"]["series"]["utilization"][0] == pytest.approx(1.0)
    answer = utilization_json(samples, records, SEEN, CAPACITY, 20.0, 5.0, 1020.0, 10.0, 50.0)
    assert answer["clock"] == "modelled" and "x time_scale 10" in answer["basis"]
    assert answer["t"] == [1000.0, 1005.0, 1010.0, 1015.0]
    assert utilization_json(samples, records, SEEN, CAPACITY, 20.0, 5.0, 1020.0, 1.0,
                            50.0)["clock"] == "wall"


def test_the_capacity_says_its_basis_in_words() -> None:
    p = profile_capacity(PROFILE, Role.PREFILL, 1000.0, 1050.0, 50.0)
    assert p.basis == "profile sim-m-acc-tp2: 10,000 prompt tokens/s at 1,000-token prompts"
    assert (p.prompt_tokens_per_s, p.output_tokens_per_s) == (10_000.0, None)
    d = profile_capacity(PROFILE, Role.DECODE, 1000.0, 1000.0, 50.0)
    assert d.output_tokens_per_s == 500.0
    assert d.basis.startswith("profile sim-m-acc-tp2: 500 output tokens/s at concurrency 10 "
                              "(ITL 20.0 ms within the 50 ms target) at 1,000-token contexts")
    tight = profile_capacity(PROFILE, Role.DECODE, 1000.0, 1000.0, 5.0)  # nothing meets 5 ms
    assert tight.output_tokens_per_s == 100.0 and "no concurrency meets" in tight.basis
    shipped = ProfileIndex().find("sim", "llama-3-70b", "h100-sxm", 2)
    assert shipped is not None
    c = profile_capacity(shipped, Role.PREFILL, 1024.0, 2048.0, 60.0)
    assert c.basis == ("profile sim-llama-3-70b-h100-sxm-tp2: 6,230 prompt tokens/s at "
                       "1,024-token prompts")


def test_no_profile_no_capacity_and_the_reason() -> None:
    """The CPU lab ships a profile at TP 1 only: at TP 2 there is no capacity, never one
    made up; the pool says why."""
    index = ProfileIndex()
    cap = profile_capacities(lambda tp: index.find("vllm", "lab-tiny", "cpu-lab", tp),
                             lambda tp: f"vllm-lab-tiny-cpu-lab-tp{tp}", 60.0)
    assert cap(Role.PREFILL, 1, 256.0, 300.0).prompt_tokens_per_s == 5784.5
    none = cap(Role.PREFILL, 2, 256.0, 300.0)
    assert none.prompt_tokens_per_s is None and none.output_tokens_per_s is None
    assert none.reason is not None and "no performance profile vllm-lab-tiny-cpu-lab-tp2" \
        in none.reason
    assert cap(Role.DECODE, None, 1.0, 1.0).reason == (
        "its TP is unknown (the controller no longer knows it)")
    external = profile_capacities(lambda tp: PROFILE, str, 50.0, "backend external")
    assert external(Role.DECODE, 2, 1.0, 1.0).basis == "no capacity: backend external"


def test_a_pool_sums_the_capacity_of_the_instances_that_have_one() -> None:
    """decode-4 runs at TP 4, which has no profile: it is left out of the pool's
    utilization, and the pool says so."""
    records = [request(0, 1000.0, None, decode="decode-4", prompt=10),
               request(1, 1000.0, None, decode="decode-3", prompt=10)]
    by_id, pools = lines(polls({"decode-3": (range(1000, 1020), 1.0),
                                "decode-4": (range(1000, 1020), 1.0)}), records)
    assert by_id["decode-4"]["series"]["utilization"] == [None] * 4
    pool = pools[Role.DECODE]
    assert pool["instances"] == [2, 2, 2, 2]
    assert pool["capacity_tokens_per_s"] == [500.0] * 4
    assert pool["reason"] is not None and pool["reason"].startswith(
        "1 of its instances (left out) have a capacity")
    three = by_id["decode-3"]["series"]["utilization"]
    assert pool["series"]["utilization"] == pytest.approx(three)


def test_the_history_is_a_bounded_ring() -> None:
    h = LoadHistory(1000)
    insts = [Instance(f"decode-{k}", Role.DECODE, 2, "", running=float(k)) for k in range(3)]
    for t in range(600):
        h.record(insts, at=1000.0 + t)
    assert h.total == 1800
    got = h.between(0.0, 1e10)
    assert len(got) == 1000 and got.t[0] == 1000.0 + 600 - 334  # the newest 1,000 rows
    assert h.between(1590.0, 1592.0).running.tolist() == [0.0, 1.0, 2.0] * 2
    assert h.seen["decode-1"] == (Role.DECODE, 2)


async def test_each_poll_of_the_engines_is_kept(tmp_path: Path) -> None:
    def engine(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="vllm:num_requests_running 3\n"
                                        "vllm:num_requests_waiting 1\n"
                                        "vllm:kv_cache_usage_perc 0.5\n")

    settings = load_settings(None, controller={"state_dir": tmp_path})
    fleet, _ = build_fleet(settings, Store(tmp_path / "state.db"), NoLauncher(),
                           httpx.AsyncClient(transport=httpx.MockTransport(engine)))
    inst = Instance("decode-2", Role.DECODE, 2, "http://e2", state=InstanceState.STARTING)
    fleet.registry.add(inst, "test")
    fleet.registry.mark_ready(inst)
    fleet.load_history.wall = lambda: 1234.0
    await fleet.poll_load()
    got = fleet.load_history.between(1234.0, 1235.0)
    assert (got.ids, got.running.tolist(), got.waiting.tolist(), got.kv_usage.tolist()) == (
        ("decode-2",), [3.0], [1.0], [0.5])
