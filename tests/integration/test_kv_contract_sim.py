"""The router keeps vLLM 0.32's KV contract, with a real controller and simulated engine
processes that model its lease (heartbeats, silent expiry, the two prefill counters):

- no ready decode instance: 503, and the prefill never computes blocks for nobody;
- decode engines killed under non-streaming load: 0 failed requests, no KV handle delivered
  to a decode engine twice, no read of freed blocks;
- a late decode hop goes colocated and its handle is released;
- 1,000 requests, half of whose clients leave between the hops: KV use back to idle within
  10 s (the lease is 30 s, so nothing may be left to expire);
- a read of freed blocks is exported per instance, alerted and pinned on its request.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.integration.harness import (
    LONG_PROMPT,
    ControllerProc,
    Load,
    engine_metric,
    start_controller,
)

pytestmark = pytest.mark.slow

HANDLE_LINE = re.compile(r"decode hop for KV handle (\S+) of engine (\S+)")
# What an engine reports while it still holds KV, shown when KV use does not return to idle.
KV_HELD = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
           "vllm:nixl_num_kv_expired_reqs_total")



def instances(ctl: ControllerProc, role: str) -> list[dict[str, object]]:
    return [i for i in ctl.get(f"/instances?role={role}") if i["state"] == "ready"]


def controller_metric(ctl: ControllerProc, name: str, label: str = "") -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in controller_lines(ctl, name)
               if label in line)


def controller_lines(ctl: ControllerProc, name: str) -> list[str]:
    text = httpx.get(f"{ctl.url}/metrics", timeout=10).text
    return [line for line in text.splitlines() if line.startswith(name)]


def kv_idle(urls: list[str]) -> bool:
    return all(engine_metric(u, "vllm:kv_cache_usage_perc") == 0.0 for u in urls)


@pytest.fixture
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv")


def test_no_ready_decode_means_503_and_the_prefill_computes_nothing(tmp: Path) -> None:
    ctl = start_controller(tmp, {"pools": {"prefill": {"size": 1, "tp": 4},
                                           "decode": {"size": 0, "tp": 2}}})
    try:
        [p] = instances(ctl, "prefill")
        r = httpx.post(f"{ctl.url}/v1/completions", timeout=30, json={
            "model": "llama-3-70b", "prompt": LONG_PROMPT, "max_tokens": 4})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "service_unavailable"
        assert engine_metric(str(p["url"]), "vllm:prompt_tokens_total") == 0
        assert engine_metric(str(p["url"]), "vllm:kv_cache_usage_perc") == 0
    finally:
        ctl.stop()


def handles_delivered(state_dir: Path) -> Counter[str]:
    """KV handles each decode engine received, from every decode log (killed ones too)."""
    seen: Counter[str] = Counter()
    for log in (state_dir / "logs").glob("decode-*.log"):
        seen.update(m.group(1) for m in HANDLE_LINE.finditer(log.read_text(errors="replace")))
    return seen


def test_killed_decode_engines_fail_no_request_and_no_handle_is_read_twice(tmp: Path) -> None:
    ctl = start_controller(tmp, {"pools": {"prefill": {"size": 1, "tp": 4},
                                           "decode": {"size": 2, "tp": 2}}})
    try:
        with Load(ctl.url, workers=6, streaming=False, long_only=True) as load:
            for _ in range(2):
                time.sleep(2.0)
                victim = instances(ctl, "decode")[0]
                os.killpg(int(str(victim["pid"])), signal.SIGKILL)
                ctl.wait(lambda v=victim: len(instances(ctl, "decode")) == 2 and all(
                    i["id"] != v["id"] for i in instances(ctl, "decode")), 60,
                    "the killed decode engine's replacement")
            time.sleep(2.0)
            res = load.stop()
        assert res.failures == [], res.failures[:5]
        assert res.ok >= 30
        delivered = handles_delivered(ctl.state_dir)
        assert len(delivered) >= 30, "the decode engines did not log the handles they got"
        assert max(delivered.values()) == 1, delivered.most_common(3)
        [p] = instances(ctl, "prefill")
        assert engine_metric(str(p["url"]), "vllm:nixl_num_notifications_after_expiry_total") == 0
        retried = [r for r in ctl.get("/requests?limit=2000") if r["retries"]]
        assert retried, "no request was caught by a kill: the test proved nothing"
        failed = ctl.get("/events?kind=instance.failed&limit=20")
        assert len(failed) == 2 and all("SIGKILL" in e["detail"] for e in failed), failed
    finally:
        ctl.stop()


def test_a_late_decode_hop_goes_colocated_and_its_blocks_are_released(tmp: Path) -> None:
    # Any decode hop is "late" with this share: every long prompt is prefilled, then served
    # colocated, and its handle released at once (the lease itself is 30 s).
    ctl = start_controller(tmp, {"kv": {"late_hop_share": 1e-9}})
    try:
        [p], [d] = instances(ctl, "prefill"), instances(ctl, "decode")
        for _ in range(5):
            r = httpx.post(f"{ctl.url}/v1/completions", timeout=30, json={
                "model": "llama-3-70b", "prompt": LONG_PROMPT, "max_tokens": 4})
            assert r.status_code == 200, r.text
        records = ctl.get("/requests?limit=5")
        assert all(r["path"] == "colocated" and r["prefill_instance"] for r in records)
        ctl.wait(lambda: kv_idle([str(p["url"])]), 5, "the prefill's blocks to be released")
        assert controller_metric(ctl, "pdctl_kv_releases_total",
                                 'reason="late",result="ok"') == 5
        assert engine_metric(str(p["url"]), "vllm:nixl_num_kv_expired_reqs_total") == 0
        assert handles_delivered(ctl.state_dir) == Counter()  # none went to a decode hop
        assert engine_metric(str(d["url"]), "vllm:prompt_tokens_total") > 0
    finally:
        ctl.stop()


async def _client(port: int, body: bytes, leave_after: float | None) -> int | None:
    """One raw HTTP request; ``leave_after``: close the socket that many seconds in."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        if leave_after is not None:
            await asyncio.sleep(leave_after)
            return None
        head = await asyncio.wait_for(reader.readuntil(b"\r\n"), 120)
        return int(head.split()[1])
    finally:
        writer.close()


async def _storm(port: int, n: int, concurrency: int, leave_window_s: float
                 ) -> list[int | None]:
    rng = random.Random(1)
    sem = asyncio.Semaphore(concurrency)

    async def one(k: int) -> int | None:
        body = json.dumps({"model": "llama-3-70b", "prompt": f"{k} {LONG_PROMPT}",
                           "max_tokens": 4}).encode()
        leave = rng.uniform(0.0, leave_window_s) if k % 2 else None
        async with sem:
            return await _client(port, body, leave)

    return await asyncio.gather(*(one(k) for k in range(n)))


def test_half_the_clients_leave_between_the_hops_and_no_kv_is_left_held(tmp: Path) -> None:
    ctl = start_controller(tmp, {"pools": {"prefill": {"size": 1, "tp": 4},
                                           "decode": {"size": 1, "tp": 2}}})
    try:
        [p], [d] = instances(ctl, "prefill"), instances(ctl, "decode")
        urls = [str(p["url"]), str(d["url"])]
        # How long a warm request takes here (the quickest of three: the first is cold), so
        # that clients leave while theirs runs.
        took = []
        for _ in range(3):
            t0 = time.monotonic()
            httpx.post(f"{ctl.url}/v1/completions", timeout=30, json={
                "model": "llama-3-70b", "prompt": LONG_PROMPT, "max_tokens": 1}
                       ).raise_for_status()
            took.append(time.monotonic() - t0)
        hop_s = min(took)
        port = int(ctl.url.rsplit(":", 1)[1])
        statuses = asyncio.run(_storm(port, 1000, 40, leave_window_s=2 * hop_s))
        last = time.monotonic()
        assert [s for s in statuses[0::2] if s != 200] == []  # every client that stayed
        try:
            ctl.wait(lambda: kv_idle(urls), 10, "prefill and decode KV use back to idle")
        except AssertionError as exc:
            held = {u: {n: engine_metric(u, n) for n in KV_HELD} for u in urls}
            raise AssertionError(f"{exc}\nengines: {held}\nreleases: "
                                 f"{controller_lines(ctl, 'pdctl_kv_releases_total')}") from None
        idle_after = time.monotonic() - last
        print(f"\n1000 requests, {statuses.count(None)} clients left within {2 * hop_s:.2f} s "
              f"(requests alone took {', '.join(f'{t:.2f}' for t in took)} s): KV idle "
              f"{idle_after:.1f} s after the last request")
        assert idle_after <= 10
        gone = [r for r in ctl.get("/requests?limit=2000") if r["status"] == "cancelled"]
        assert len(gone) >= 300, len(gone)  # most left before their answer
        released = controller_metric(ctl, "pdctl_kv_releases_total",
                                     'reason="client_gone",result="ok"')
        assert released > 0, "no client left between the hops: the test proved nothing"
        assert controller_metric(ctl, "pdctl_kv_releases_total", 'result="failed"') == 0
        assert engine_metric(urls[0], "vllm:nixl_num_kv_expired_reqs_total") == 0
    finally:
        ctl.stop()


def test_reads_of_freed_blocks_are_exported_alerted_and_pinned_on_the_request(tmp: Path
                                                                              ) -> None:
    ctl = start_controller(tmp, {"kv": {"lease_s": 6}})
    try:
        [p] = instances(ctl, "prefill")
        purl, pid = str(p["url"]), str(p["id"])
        r = httpx.post(f"{ctl.url}/v1/completions", timeout=30, json={
            "model": "llama-3-70b", "prompt": LONG_PROMPT, "max_tokens": 4})
        assert r.status_code == 200, r.text
        [rec] = ctl.get("/requests?limit=1")
        assert rec["path"] == "disaggregated" and rec["kv_handle"] and not rec["suspect"]
        # A second read of the same handle, as a decode engine would make it: the prefill
        # freed those blocks after the first read, answers anyway and only counts it.
        pull = httpx.post(f"{purl}/sim/kv/pull", timeout=10, json={
            "remote_request_id": rec["kv_handle"], "remote_engine_id": pid,
            "remote_block_ids": [0]})
        assert pull.status_code == 200, pull.text
        # A handle nobody reads: the prefill frees it when its 6 s lease expires.
        held = httpx.post(f"{purl}/v1/completions", timeout=30, json={
            "model": "llama-3-70b", "prompt": LONG_PROMPT, "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True}})
        assert held.status_code == 200, held.text

        def exported() -> bool:
            return (controller_metric(ctl, "pdctl_instance_kv_notifications_after_expiry_total",
                                      f'instance="{pid}"') == 1
                    and controller_metric(ctl, "pdctl_instance_kv_expired_requests_total",
                                          f'instance="{pid}"') == 1)

        ctl.wait(exported, 20, "the prefill's lease counters on the controller's /metrics")
        ctl.wait(lambda: ctl.get("/requests?limit=1")[0]["suspect"], 10, "a suspect record")
        kv = ctl.get("/stats?window_s=300")["kv_integrity"]
        assert kv["alert"] and kv["notifications_after_expiry"] == 1 and kv["suspect_requests"] == 1
        assert kv["expired_requests"] == 1
        kinds = [e["kind"] for e in ctl.get("/events?limit=50")]
        assert "kv.after_expiry" in kinds and "kv.expired" in kinds
        assert controller_metric(ctl, "pdctl_kv_suspect_requests_total") == 1
    finally:
        ctl.stop()
