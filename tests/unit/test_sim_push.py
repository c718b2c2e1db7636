"""Push mode of the simulated engine (vLLM 0.32's NixlPushConnector), in-process.

A prefill and a decode engine joined either directly (``kv_peers``, as a sim host's engines
are) or over their HTTP side channels (``kv_transport`` routing by port), and the pure parts:
request-id matching, the prefill's book of registrations, the messages.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest

from controller.engines.sim import SimEngineConfig, create_engine_app
from controller.engines.sim.config import SimConfigError, validate_config
from controller.engines.sim.engine import SimEngine
from controller.engines.sim.protocol import EngineError, parse_request, rejected_remote_prefill
from controller.engines.sim.push import (
    PushBook,
    Pushed,
    Registration,
    base_request_id,
    find_handle,
)
from controller.engines.sim.server import add_arguments, config_from_args
from controller.tokens import estimate_tokens

PREFILL = SimEngineConfig(port=8510, role="prefill", model="llama-3-8b", engine_id="P",
                          time_scale=0.01, kv_connector="NixlPushConnector")
DECODE = replace(PREFILL, port=8610, role="decode", engine_id="D")
PROMPT = "the prefill writes its KV into the decode engine's blocks " * 8
PROMPT_TOKENS = estimate_tokens(PROMPT)
BODY: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 4}
P_HOP = {"do_remote_decode": True, "do_remote_prefill": False}
D_HOP = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "P",
         "remote_host": "127.0.0.1", "remote_port": PREFILL.port, "tp_size": 1}
FAILED = "vllm:nixl_num_failed_transfers_total"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"


# ---- pure parts ----------------------------------------------------------------------------

def test_base_request_id_strips_vllms_random_suffix_only() -> None:
    assert base_request_id("req-1-0a1b2c3d") == "req-1"
    assert base_request_id("req-1-0A1B2C3D") == "req-1"
    assert base_request_id("req-1") == "req-1"
    assert base_request_id("req-0a1b2c3d4e") == "req-0a1b2c3d4e"  # not 8 hex digits
    assert find_handle({"x": 1, "req-1-deadbeef": 2}, "req-1") == "req-1-deadbeef"
    assert find_handle({"req-1": 1, "req-1-deadbeef": 2}, "req-1") == "req-1"
    assert find_handle({"other": 1}, "req-1") is None


def _reg(request_id: str = "r1") -> Registration:
    return Registration(request_id, "P", "127.0.0.1", 8510, "D", "127.0.0.1", 8610, 3)


def test_push_book_matches_by_base_id_and_prunes() -> None:
    book = PushBook()
    book.register(_reg("r1-0a1b2c3d"), deadline=10.0)
    assert book.num_registrations == 1
    assert book.take_registration("r1") == _reg("r1-0a1b2c3d")
    assert book.take_registration("r1") is None
    book.register(_reg("r2"), deadline=10.0)
    book.remember_release("r3", deadline=5.0)
    assert book.prune(5.0) == []
    assert book.take_released("r3") is False  # pruned at its deadline
    book.remember_release("r3", deadline=20.0)
    assert book.take_released("r3-ffffffff") is True
    assert book.prune(10.0) == [_reg("r2")]
    assert book.num_registrations == 0
    book.register(_reg("r4"), deadline=10.0)
    assert book.drop_registration("r4") and not book.drop_registration("r4")


def test_messages_round_trip_and_name_bad_fields() -> None:
    assert Registration.from_body(_reg().body()) == _reg()
    done = Pushed("r1", "D", 100, 3, 4096, 0.25)
    assert Pushed.from_body({**done.body(), "xfer_s": 1}) == replace(done, xfer_s=1.0)
    with pytest.raises(ValueError, match="num_blocks is missing"):
        Registration.from_body({k: v for k, v in _reg().body().items() if k != "num_blocks"})
    with pytest.raises(ValueError, match="decode_port must be a number"):
        Registration.from_body({**_reg().body(), "decode_port": "8610"})
    with pytest.raises(ValueError, match="kv_bytes must be a number"):
        Pushed.from_body({**done.body(), "kv_bytes": True})


def test_a_push_decode_hop_names_only_its_prefill() -> None:
    body = {**BODY, "kv_transfer_params": D_HOP}
    req = parse_request(body, chat=False, request_id="r1", model_name="m",
                        max_model_len=8192, push=True)
    assert req.remote_prefill is not None
    assert (req.remote_prefill.request_id, req.remote_prefill.engine_id,
            req.remote_prefill.port, req.remote_prefill.block_ids) == ("r1", "P", 8510, [])
    with pytest.raises(EngineError, match="remote_request_id"):  # pull needs the handle
        parse_request(body, chat=False, request_id="r1", model_name="m", max_model_len=8192)
    bad = {**body, "kv_transfer_params": {**D_HOP, "remote_port": "8510"}}
    with pytest.raises(EngineError, match="remote_port an integer"):
        parse_request(bad, chat=False, request_id="r1", model_name="m", max_model_len=8192,
                      push=True)
    rejected = rejected_remote_prefill({**body, "n": 2}, push=True, request_id="r1")
    assert rejected is not None and rejected.request_id == "r1"


def test_cli_flags_and_validation() -> None:
    import argparse
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args([
        "--port", "9000", "--model", "llama-3-8b", "--kv-connector", "NixlPushConnector",
        "--push-registration-timeout", "2.5", "--fault-kv-unreachable"]))
    assert (cfg.kv_transfer_mode, cfg.push_timeout_s, cfg.fault_kv_unreachable) == (
        "push", 2.5, True)
    plain = config_from_args(parser.parse_args(["--port", "9000", "--model", "llama-3-8b"]))
    assert (plain.kv_connector, plain.kv_transfer_mode, plain.push_timeout_s) == (
        "NixlConnector", "pull", plain.kv_lease_duration_s)
    with pytest.raises(SimConfigError, match="push_registration_timeout_s must be > 0"):
        validate_config(replace(cfg, push_registration_timeout_s=0.0))
    with pytest.raises(SimConfigError, match="unknown kv_connector"):
        validate_config(replace(cfg, kv_connector="LMCache"))  # type: ignore[arg-type]


# ---- two engines -----------------------------------------------------------------------------

class ByPort(httpx.AsyncBaseTransport):
    """Side-channel calls to the app that serves the URL's port; records the paths."""

    def __init__(self) -> None:
        self.apps: dict[int, httpx.ASGITransport] = {}
        self.calls: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request.url.path)
        app = self.apps.get(request.url.port or 80)
        if app is None:
            raise httpx.ConnectError("connection refused", request=request)
        return await app.handle_async_request(request)


@dataclass
class Pair:
    prefill: httpx.AsyncClient
    decode: httpx.AsyncClient
    p: SimEngine
    d: SimEngine
    side: ByPort


@asynccontextmanager
async def pair(http: bool, prefill_kw: dict[str, Any] | None = None,
               decode_kw: dict[str, Any] | None = None) -> AsyncIterator[Pair]:
    engines: dict[int, SimEngine] = {}
    side = ByPort()

    def peers(host: str, port: int) -> SimEngine | None:
        return engines.get(port)

    kw: dict[str, Any] = {"kv_transport": side} if http else {"kv_peers": peers}
    p_app = create_engine_app(replace(PREFILL, **(prefill_kw or {})), **kw)
    d_app = create_engine_app(replace(DECODE, **(decode_kw or {})), **kw)
    for app in (p_app, d_app):
        engine: SimEngine = app.state.sim.engine
        engines[engine.cfg.port] = engine
        side.apps[engine.cfg.port] = httpx.ASGITransport(app=app)
    async with p_app.router.lifespan_context(p_app), d_app.router.lifespan_context(d_app), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=p_app), base_url="http://p") as p, \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=d_app), base_url="http://d") as d:
        yield Pair(p, d, engines[PREFILL.port], engines[DECODE.port], side)


async def prefill_hop(c: httpx.AsyncClient, rid: str) -> httpx.Response:
    return await c.post("/v1/completions", json={**BODY, "kv_transfer_params": P_HOP},
                        headers={"X-Request-Id": rid})


async def decode_hop(c: httpx.AsyncClient, rid: str, **params: Any) -> httpx.Response:
    return await c.post("/v1/completions",
                        json={**BODY, "kv_transfer_params": {**D_HOP, **params}},
                        headers={"X-Request-Id": rid})


async def metric(c: httpx.AsyncClient, name: str, **labels: str) -> float:
    want = {"model_name": "llama-3-8b", **labels}
    for line in (await c.get("/metrics")).text.splitlines():
        m = re.match(r"^([^{ ]+)\{(.*)\} (\S+)$", line)
        if m and m.group(1) == name and dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))) == want:
            return float(m.group(3))
    raise AssertionError(f"{name} {labels} not in metrics")


async def until(cond: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("http", [False, True], ids=["peers", "http"])
async def test_both_hops_at_once_push_the_kv_and_free_the_prefill(http: bool) -> None:
    async with pair(http) as s:
        p_resp, d_resp = await asyncio.gather(prefill_hop(s.prefill, "r1"),
                                              decode_hop(s.decode, "r1"))
        assert p_resp.status_code == 200 and d_resp.status_code == 200, d_resp.text
        params = p_resp.json()["kv_transfer_params"]
        assert params["transfer_mode"] == "push" and params["remote_engine_id"] == "P"
        assert d_resp.json()["usage"]["completion_tokens"] == 4
        assert d_resp.json()["metrics"]["kv_transfer_ms"] > 0
        await until(lambda: s.p.num_kv_handles == 0)
        assert s.p.scheduler.kv_usage == 0.0
        info = (await s.prefill.get("/sim/info")).json()
        assert (info["kv_transfer_mode"], info["kv_handles"],
                info["kv_push_registrations"]) == ("push", 0, 0)
        assert await metric(s.decode, BY_SOURCE, source="external_kv_transfer") \
            == PROMPT_TOKENS - 1
        assert await metric(s.decode, BY_SOURCE, source="local_compute") == 1
        assert await metric(s.decode, FAILED) == 0
        if http:
            assert "/sim/kv/register" in s.side.calls and "/sim/kv/pushed" in s.side.calls


async def test_a_registration_after_the_prefill_finished_starts_the_write() -> None:
    async with pair(False) as s:
        assert (await prefill_hop(s.prefill, "late")).status_code == 200
        assert s.p.num_kv_handles == 1
        resp = await decode_hop(s.decode, "late")
        assert resp.status_code == 200, resp.text
        await until(lambda: s.p.num_kv_handles == 0)
        assert await metric(s.prefill, "vllm:nixl_num_kv_expired_reqs_total") == 0


async def test_a_registration_before_the_prefill_waits_for_it() -> None:
    async with pair(True) as s:
        d_task = asyncio.create_task(decode_hop(s.decode, "early"))
        await until(lambda: s.p.num_push_registrations == 1 and s.d.num_push_waiting == 1)
        assert (await prefill_hop(s.prefill, "early")).status_code == 200
        resp = await d_task
        assert resp.status_code == 200, resp.text
        assert resp.json()["metrics"]["queue_time_ms"] > 0  # waiting for the KV is queueing
        await until(lambda: s.p.num_kv_handles == 0)
        assert s.p.num_push_registrations == 0


@pytest.mark.parametrize("policy", ["fail", "recompute"])
async def test_a_registration_never_fulfilled_fails_by_the_policy(policy: str) -> None:
    async with pair(False, decode_kw={"kv_load_failure_policy": policy,
                                      "push_registration_timeout_s": 0.2}) as s:
        resp = await decode_hop(s.decode, "orphan")  # no prefill hop ever comes
        assert resp.status_code == (500 if policy == "fail" else 200), resp.text
        if policy == "fail":
            assert "did not push the KV within 0.2 s" in resp.json()["error"]["message"]
        else:
            assert await metric(s.decode, BY_SOURCE, source="local_compute") == PROMPT_TOKENS
            assert await metric(s.decode, BY_SOURCE, source="external_kv_transfer") == 0
        assert await metric(s.decode, FAILED) == 1
        await until(lambda: s.p.num_push_registrations == 0)  # the decode engine released it
        assert s.d.scheduler.kv_usage == 0.0


@pytest.mark.parametrize("http", [False, True], ids=["peers", "http"])
async def test_a_wrong_engine_id_or_unreachable_prefill_fails_at_once(http: bool) -> None:
    async with pair(http, decode_kw={"push_registration_timeout_s": 30.0}) as s:
        resp = await decode_hop(s.decode, "wrong", remote_engine_id="nobody")
        assert resp.status_code == 500 and "handshake" in resp.json()["error"]["message"]
        if http:  # no app serves port 1: the connection is refused
            resp = await decode_hop(s.decode, "gone", remote_port=1)
            assert resp.status_code == 500
            assert "unreachable" in resp.json()["error"]["message"]
        assert await metric(s.decode, FAILED) == (2 if http else 1)
        assert s.d.scheduler.kv_usage == 0.0


async def test_a_pull_mode_prefill_refuses_registrations() -> None:
    async with pair(True, prefill_kw={"kv_connector": "NixlConnector"}) as s:
        resp = await decode_hop(s.decode, "mixed")
        assert resp.status_code == 500
        assert "pull mode" in resp.json()["error"]["message"]


@pytest.mark.parametrize("http", [False, True], ids=["peers", "http"])
async def test_the_fault_knob_makes_kv_loads_recompute_silently(http: bool) -> None:
    async with pair(http, decode_kw={"kv_load_failure_policy": "recompute"}) as s:
        set_fault = await s.decode.post("/sim/fault", json={"kv_unreachable": True})
        assert set_fault.json() == {"kv_unreachable": True, "push_stalled": False}
        p_resp, d_resp = await asyncio.gather(prefill_hop(s.prefill, "f1"),
                                              decode_hop(s.decode, "f1"))
        assert p_resp.status_code == 200 and d_resp.status_code == 200
        assert await metric(s.decode, BY_SOURCE, source="local_compute") == PROMPT_TOKENS
        assert await metric(s.decode, FAILED) == 1
        assert (await s.decode.get("/sim/info")).json()["kv_unreachable"] is True
        assert (await s.decode.post("/sim/fault", json={"kv_unreachable": "yes"})
                ).status_code == 400
        await s.decode.post("/sim/fault", json={"kv_unreachable": False})
        p_resp, d_resp = await asyncio.gather(prefill_hop(s.prefill, "f2"),
                                              decode_hop(s.decode, "f2"))
        assert d_resp.status_code == 200
        assert await metric(s.decode, FAILED) == 1


async def test_a_stalled_prefill_takes_registrations_and_never_writes() -> None:
    """The push_stalled knob (the real lab's failed prefill-to-decode handshake): the
    registration is dropped and the decode hop waits until its registration timeout."""
    async with pair(True, decode_kw={"push_registration_timeout_s": 0.5}) as s:
        assert (await s.prefill.post("/sim/fault", json={"push_stalled": True})).json() \
            == {"kv_unreachable": False, "push_stalled": True}
        assert (await s.prefill.get("/sim/info")).json()["push_stalled"] is True
        for bad in ({}, {"push_stalled": 1}, {"other": True}):
            assert (await s.prefill.post("/sim/fault", json=bad)).status_code == 400
        started = time.monotonic()
        p_resp, d_resp = await asyncio.gather(prefill_hop(s.prefill, "st1"),
                                              decode_hop(s.decode, "st1"))
        assert p_resp.status_code == 200
        assert d_resp.status_code == 500 and "did not push" in d_resp.json()["error"]["message"]
        assert time.monotonic() - started >= 0.5
        await until(lambda: s.p.num_kv_handles == 0)  # released by the decode engine
        await s.prefill.post("/sim/fault", json={"push_stalled": False})
        p_resp, d_resp = await asyncio.gather(prefill_hop(s.prefill, "st2"),
                                              decode_hop(s.decode, "st2"))
        assert d_resp.status_code == 200


async def test_the_fault_knob_in_pull_mode() -> None:
    pull = {"kv_connector": "NixlConnector"}
    async with pair(False, prefill_kw=pull, decode_kw={
            **pull, "kv_load_failure_policy": "recompute", "fault_kv_unreachable": True}) as s:
        p_resp = await prefill_hop(s.prefill, "pf")
        params = p_resp.json()["kv_transfer_params"]
        assert "transfer_mode" not in params  # pull answers as before
        resp = await s.decode.post("/v1/completions", json={**BODY, "kv_transfer_params": params},
                                   headers={"X-Request-Id": "pf"})
        assert resp.status_code == 200
        assert await metric(s.decode, BY_SOURCE, source="local_compute") == PROMPT_TOKENS
        assert await metric(s.decode, FAILED) == 1


async def test_a_rejected_decode_hop_frees_the_prefill_before_or_after_it_finished() -> None:
    async with pair(False, prefill_kw={"time_scale": 5.0}) as s:  # a prefill to catch running
        bad = {**BODY, "n": 2, "kv_transfer_params": D_HOP}
        # after: the prefill holds the blocks; the rejection releases them
        assert (await prefill_hop(s.prefill, "rej1")).status_code == 200
        assert (await s.decode.post("/v1/completions", json=bad,
                                    headers={"X-Request-Id": "rej1"})).status_code == 400
        await until(lambda: s.p.num_kv_handles == 0)
        # before: the prefill frees them as soon as it finishes
        p_task = asyncio.create_task(prefill_hop(s.prefill, "rej2"))
        await until(lambda: "rej2" in s.p.scheduler.live_ids())
        assert (await s.decode.post("/v1/completions", json=bad,
                                    headers={"X-Request-Id": "rej2"})).status_code == 400
        assert (await p_task).status_code == 200
        await until(lambda: s.p.num_kv_handles == 0)
        assert await metric(s.prefill, "vllm:nixl_num_kv_expired_reqs_total") == 0
        assert await metric(s.prefill, "vllm:nixl_num_notifications_after_expiry_total") == 0


async def test_an_abort_while_waiting_for_the_write_releases_the_registration() -> None:
    async with pair(False) as s:
        d_task = asyncio.create_task(decode_hop(s.decode, "ab"))
        await until(lambda: s.d.num_push_waiting == 1)
        d_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await d_task
        await until(lambda: s.p.num_push_registrations == 0)
        assert s.d.num_push_waiting == 0 and s.d.scheduler.kv_usage == 0.0
        assert (await prefill_hop(s.prefill, "ab")).status_code == 200
        assert s.p.num_kv_handles == 1  # nobody registered: held under the lease


def test_the_sim_launchers_pass_the_push_connector_from_the_launch_spec() -> None:
    from pathlib import Path

    from controller.config import Settings
    from controller.launchers.base import LaunchSpec
    from controller.launchers.sim import SimEngineKind
    from controller.models import Role

    @dataclass(frozen=True)
    class Spec(LaunchSpec):  # kv_mode as the controller's LaunchSpec carries it
        kv_mode: str = "push"

    kind = SimEngineKind(Settings(model={"name": "llama-3.1-8b"}))
    base = LaunchSpec(instance_id="d0", role=Role.DECODE, tp=1, accelerators=(0,),
                      log_path=Path("d0.log"))
    assert "--kv-connector" not in kind.argv(base, 9000)  # pull: the argv of before
    argv = kind.argv(Spec(**{**vars(base), "kv_mode": "push"}), 9000)
    assert argv[argv.index("--kv-connector") + 1] == "NixlPushConnector"
    assert "--kv-connector" not in kind.argv(Spec(**{**vars(base), "kv_mode": "pull"}), 9000)
    assert kind.kv_peer(base, "0.0.0.0", 9000, 9001) == {
        "engine_id": "d0", "host": "127.0.0.1", "port": 9000, "tp_size": 1}
