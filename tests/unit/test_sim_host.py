"""The sim host's control API in-process, its engines on real loopback ports: start, list,
stop, the errors (bad flags, a taken port, a duplicate id, an unknown engine), each engine's
own log, and a two-hop request whose KV pull stays inside the host."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from controller.engines.sim.host import ENGINE, SimHost, _ByEngine, create_host_app
from controller.launchers.process import free_port

FLAGS = ["--model", "llama-3-8b", "--time-scale", "0.01"]


@pytest.fixture
async def host() -> AsyncIterator[tuple[SimHost, httpx.AsyncClient]]:
    h = SimHost()
    app = create_host_app(h)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://host") as client:
        yield h, client
    await h.close()


async def start(client: httpx.AsyncClient, engine_id: str, *extra: str,
                port: int | None = None, log_path: str | None = None) -> httpx.Response:
    args = ["--port", str(port or free_port()), "--engine-id", engine_id, *FLAGS, *extra]
    return await client.post("/host/engines", json={"args": args, "log_path": log_path})


async def test_engines_start_on_their_own_ports_and_stop(
        host: tuple[SimHost, httpx.AsyncClient]) -> None:
    h, client = host
    r = await start(client, "p1", "--role", "prefill")
    assert r.status_code == 201, r.text
    url = r.json()["url"]
    async with httpx.AsyncClient() as net:
        assert (await net.get(f"{url}/health")).status_code == 200
        models = (await net.get(f"{url}/v1/models")).json()
    assert models["data"][0]["id"] == "llama-3-8b"
    listing = (await client.get("/host/engines")).json()["engines"]
    assert [(e["engine_id"], e["role"], e["state"]) for e in listing] == [
        ("p1", "prefill", "running")]
    stopped = await client.delete("/host/engines/p1", params={"grace_s": 1})
    assert stopped.json()["state"] == "exited" and stopped.json()["exit_reason"] == "stopped"
    async with httpx.AsyncClient() as net:
        with pytest.raises(httpx.ConnectError):
            await net.get(f"{url}/health")


async def test_bad_requests_are_refused_and_change_nothing(
        host: tuple[SimHost, httpx.AsyncClient]) -> None:
    h, client = host
    port = free_port()
    assert (await start(client, "a", port=port)).status_code == 201
    cases = [
        (await start(client, "b", port=port), 409, "cannot serve"),  # port taken
        (await start(client, "a"), 409, "already runs"),
        (await start(client, "c", "--tp", "0"), 422, "tp"),
        (await start(client, "d", "--model", "gpt-9"), 422, "unknown model"),
        (await client.post("/host/engines", json={"args": ["--engine-id", "e"]}), 422,
         "required: --port"),
        (await client.post("/host/engines", json={"args": "--port 1"}), 422, "list of strings"),
        (await client.post("/host/engines", content=b"{"), 422, "expected"),
        (await client.delete("/host/engines/nope"), 404, "no engine nope"),
        (await client.delete("/host/engines/a", params={"grace_s": "soon"}), 422, "grace_s"),
    ]
    for resp, status, words in cases:
        assert resp.status_code == status, (resp.status_code, resp.text)
        assert words in resp.json()["error"]["message"], resp.text
    listing = (await client.get("/host/engines")).json()["engines"]
    assert [(e["engine_id"], e["state"]) for e in listing] == [("a", "running")]


async def test_kv_pull_between_engines_of_one_host_stays_in_process(
        host: tuple[SimHost, httpx.AsyncClient]) -> None:
    h, client = host
    p = (await start(client, "P", "--role", "prefill")).json()
    d = (await start(client, "D", "--role", "decode")).json()
    prompt = "a prompt long enough to have a few KV blocks " * 10
    hop1 = {"do_remote_decode": True, "do_remote_prefill": False}
    async with httpx.AsyncClient(timeout=10) as net:
        first = (await net.post(f"{p['url']}/v1/completions", json={
            "model": "llama-3-8b", "prompt": prompt, "max_tokens": 1,
            "kv_transfer_params": hop1})).json()
        params = {**first["kv_transfer_params"], "do_remote_prefill": True,
                  "do_remote_decode": False}
        second = await net.post(f"{d['url']}/v1/completions", json={
            "model": "llama-3-8b", "prompt": prompt, "max_tokens": 4,
            "kv_transfer_params": params})
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["completion_tokens"] == 4
    # The pull called the prefill engine of this process: the decode engine never needed an
    # HTTP client for its side channel.
    assert h.engines["D"].app.state.sim.engine._puller._client is None
    assert h.engine_at("127.0.0.1", p["port"]) is h.engines["P"].app.state.sim.engine
    async with httpx.AsyncClient() as net:
        metrics = (await net.get(f"{d['url']}/metrics")).text
    assert 'vllm:prompt_tokens_by_source_total{model_name="llama-3-8b",source=' \
           '"external_kv_transfer"}' in metrics


def test_log_records_go_to_the_engine_whose_task_emitted_them(tmp_path: Path) -> None:
    h = SimHost()
    router = _ByEngine(h)
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    class Fake:
        log = Keep()
    h.engines["x"] = Fake()  # type: ignore[assignment]
    rec = logging.makeLogRecord({"msg": "for x"})
    token = ENGINE.set("x")
    router.handle(rec)
    ENGINE.reset(token)
    assert seen == ["for x"]


async def test_a_host_whose_port_was_taken_starts_again_on_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The port chosen for a host process is free when chosen, not reserved: a host that
    finds it taken is started again on a fresh one (seen in CI as a failed instance)."""
    import socket

    from controller.config import load_settings
    from controller.launchers import sim_host

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    monkeypatch.setattr(sim_host, "free_port", lambda: next(ports, None) or free_port())
    launcher = sim_host.SimHostLauncher(load_settings(
        None, backend="sim", sim={"processes": 1}, controller={"state_dir": tmp_path}))
    try:
        host = await launcher._start_host(tmp_path)
        launcher._hosts.append(host)  # stopped by close()
        assert host.url != f"http://127.0.0.1:{taken.getsockname()[1]}"
        assert "address already in use" in (tmp_path / "sim-host-0.log").read_text()
    finally:
        await launcher.close()
        taken.close()
