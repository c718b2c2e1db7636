"""The controller's two HTTP surfaces under hostile input, on the wire: a real controller
process with simulated engine processes. Each test names the finding of issue 16 it keeps
fixed (finding 7, a live ``request_timeout_s``, is ``test_live_routing.py``); the listener,
restart and ``pdctl lab`` findings (9, 10, 12) are ``test_listener.py``."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest

from bench import prom
from tests.integration.harness import LONG_PROMPT, SHORT_PROMPT, ControllerProc, start_controller

MODEL = "llama-3-70b"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    c = start_controller(tmp_path_factory.mktemp("hardening"), {
        "sim": {"time_scale": 1.0, "startup_delay_s": 0.3},
        "routing": {"disagg_min_prompt_tokens": 64},
        "controller": {"max_body_bytes": 65536, "body_timeout_s": 1.0},
        "pools": {"prefill": {"size": 1, "tp": 2}, "decode": {"size": 1, "tp": 2}}})
    yield c
    c.stop()


def post(ctl: ControllerProc, body: Any, endpoint: str = "/v1/completions",
         headers: dict[str, str] | None = None, rid: str | None = None) -> httpx.Response:
    h = {**JSON, **(headers or {})}
    if rid:
        h["x-request-id"] = rid
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(f"{ctl.url}{endpoint}", content=content, headers=h, timeout=60)


def record(ctl: ControllerProc, rid: str) -> dict[str, Any]:
    found = [r for r in ctl.get("/requests", limit=10_000) if r["id"] == rid]
    assert len(found) == 1, f"request {rid} recorded {len(found)} times"
    return found[0]


def openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and err["code"] == status
    return err


def engine_counter(ctl: ControllerProc, role: str, name: str) -> float:
    """The sum of an engine metric over the role's ready instances."""
    total = 0.0
    for inst in ctl.get("/instances", role=role, state="ready"):
        total += prom.parse(httpx.get(f"{inst['url']}/metrics", timeout=10).text).sum(name)
    return total


def events(ctl: ControllerProc, kind: str | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"limit": 10_000}
    if kind:
        params["kind"] = kind
    return list(reversed(ctl.get("/events", **params)))  # oldest first


# ---- finding 1 and 11: authentication --------------------------------------------------


@pytest.mark.parametrize("value", [b"Bearer \xe9\xe9", b"Bearer \xff\xfe", b"\xe9\xe9",
                                   b"Bearer", b"Basic abc", b"Bearer  TOKEN"])
def test_any_authorization_value_gets_401_never_500(ctl: ControllerProc, value: bytes) -> None:
    value = value.replace(b"TOKEN", ctl.token.encode())
    r = httpx.get(f"{ctl.url}/api/v1/cluster", headers=[(b"authorization", value)], timeout=10)
    assert r.status_code == 401, r.text
    assert r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"


def test_authorization_is_exactly_one_bearer_token(ctl: ControllerProc) -> None:
    url, token = f"{ctl.url}/api/v1/routing", ctl.token.encode()
    twice = [(b"authorization", b"Bearer " + token), (b"authorization", b"Bearer " + token)]
    assert httpx.get(url, headers=twice, timeout=10).status_code == 401
    trailing = [(b"authorization", b"Bearer " + token + b"x")]
    assert httpx.get(url, headers=trailing, timeout=10).status_code == 401
    # HTTP auth schemes are case-insensitive (RFC 9110, 11.1): "bearer" is the same scheme.
    lower = [(b"authorization", b"bearer " + token)]
    assert httpx.get(url, headers=lower, timeout=10).status_code == 200


def test_unauthenticated_request_is_401_whatever_its_body(ctl: ControllerProc) -> None:
    for content in (b"{not json", b'{"size": "two"}', b"\xff\xfe"):
        r = httpx.patch(f"{ctl.url}/api/v1/pools/prefill", content=content, headers=JSON,
                        timeout=10)
        assert r.status_code == 401, r.text
    r = httpx.patch(f"{ctl.url}/api/v1/pools/prefill", content=b"x",
                    headers={"content-type": "text/plain"}, timeout=10)
    assert r.status_code == 401


# ---- finding 2: bounded query parameters -------------------------------------------------


@pytest.mark.parametrize("since_id", [2**63, -1, -(2**63) - 1, 10**30])
def test_events_since_id_out_of_range_is_422(ctl: ControllerProc, since_id: int) -> None:
    r = ctl.api("GET", "/events", params={"since_id": since_id})
    assert r.status_code == 422, r.text
    assert "since_id" in r.json()["detail"]


def test_events_since_id_at_the_bounds(ctl: ControllerProc) -> None:
    assert ctl.get("/events", since_id=2**63 - 1) == []
    assert ctl.get("/events", since_id=0, limit=1)


def test_unknown_query_parameters_are_422_with_what_the_route_takes(ctl: ControllerProc
                                                                     ) -> None:
    r = ctl.api("GET", "/events", params={"limt": 5})
    assert r.status_code == 422, r.text
    assert r.json() == {"detail": "unknown query parameter(s): limt; this route takes "
                        "kind, limit, since, since_id, until", "field": "limt"}
    r = ctl.api("GET", "/cluster", params={"verbose": 1})
    assert (r.status_code, r.json()["field"]) == (422, "verbose"), r.text
    assert r.json()["detail"].endswith("this route takes none")
    assert ctl.api("GET", "/stats", params={"window_s": 30}).status_code == 200


# ---- finding 3: malformed OpenAI bodies are 400 and recorded --------------------------------


@pytest.mark.parametrize("text", [None, 5, ["a"], {"t": 1}])
@pytest.mark.parametrize("stream", [False, True])
def test_malformed_chat_content_is_400_and_recorded(ctl: ControllerProc, text: Any,
                                                    stream: bool) -> None:
    rid = f"bad-chat-{type(text).__name__}-{stream}"
    r = post(ctl, {"model": MODEL, "stream": stream, "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": text}]}]},
        "/v1/chat/completions", rid=rid)
    err = openai_error(r, 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == "messages[0].content[0].text"
    assert r.headers["x-request-id"] == rid
    rec = record(ctl, rid)
    assert rec["status"] == "rejected" and "text" in rec["error"]
    assert rec["decode_instance"] is None and rec["prefill_instance"] is None


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": SHORT_PROMPT, "max_tokens": "3"}, "max_tokens"),
    ({"prompt": SHORT_PROMPT, "max_tokens": True}, "max_tokens"),
    ({"prompt": SHORT_PROMPT, "stream": "yes"}, "stream"),
    ({"prompt": SHORT_PROMPT, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": SHORT_PROMPT, "temperature": -1}, "temperature"),
    ({"prompt": SHORT_PROMPT, "top_p": 0}, "top_p"),
    ({"prompt": SHORT_PROMPT, "n": 0}, "n"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"max_tokens": 3}, "prompt"),
    ({"prompt": SHORT_PROMPT, "model": 7}, "model"),
])
def test_malformed_completion_is_400_with_its_field(ctl: ControllerProc, body: dict[str, Any],
                                                    param: str) -> None:
    r = post(ctl, {"model": MODEL, **body} if "model" not in body else body)
    assert openai_error(r, 400)["param"] == param


def test_not_json_not_an_object_and_wrong_model(ctl: ControllerProc) -> None:
    for content in (b"{not json", b"[1, 2]", b'"text"', b""):
        assert openai_error(post(ctl, content), 400)["type"] == "invalid_request_error"
    err = openai_error(post(ctl, {"model": "gpt-4", "prompt": SHORT_PROMPT}), 404)
    assert err["param"] == "model" and MODEL in err["message"]


def test_body_must_be_sent_as_json(ctl: ControllerProc) -> None:
    body = orjson.dumps({"model": MODEL, "prompt": SHORT_PROMPT, "max_tokens": 2})
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"x-request-id": f"ctype-{ctype}"}
        if ctype:
            headers["content-type"] = ctype
        r = httpx.post(f"{ctl.url}/v1/completions", content=body, headers=headers, timeout=30)
        assert openai_error(r, 415)["type"] == "invalid_request_error"
        assert record(ctl, f"ctype-{ctype}")["status"] == "rejected"
    ok = post(ctl, body, headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text


def test_oversized_and_slow_bodies(ctl: ControllerProc) -> None:
    big = {"model": MODEL, "prompt": "x" * 100_000, "max_tokens": 1}
    err = openai_error(post(ctl, big, rid="too-big"), 413)
    assert "max_body_bytes" in err["message"]
    assert record(ctl, "too-big")["status"] == "rejected"
    # Headers promise 100 bytes, 10 come: 408 after controller.body_timeout_s (1 s here).
    host, port = ctl.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                  b"application/json\r\ncontent-length: 100\r\n\r\n{\"model\":")
        t0 = time.monotonic()
        answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert 0.8 < time.monotonic() - t0 < 5


def test_every_client_mistake_counts_as_rejected_in_metrics(ctl: ControllerProc) -> None:
    def rejected() -> float:
        return prom.parse(ctl.metrics_text()).sum("pdctl_requests_total", status="rejected")
    before = rejected()
    post(ctl, {"model": MODEL, "prompt": SHORT_PROMPT, "n": -1})
    assert rejected() == before + 1


# ---- finding 4: kv_transfer_params is the router's ----------------------------------------


def test_client_kv_transfer_params_never_reach_an_engine(ctl: ControllerProc) -> None:
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen(8)
        trap.settimeout(1.5)
        port = trap.getsockname()[1]
        for params in ({"do_remote_prefill": True, "remote_engine_id": "x",
                        "remote_request_id": "x", "remote_host": "127.0.0.1",
                        "remote_port": port, "remote_block_ids": [0, 1]},
                       {"do_remote_decode": True}, None):
            for endpoint, body in (("/v1/completions", {"prompt": SHORT_PROMPT}),
                                   ("/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": "hi"}]})):
                r = post(ctl, {"model": MODEL, "max_tokens": 2, **body,
                               "kv_transfer_params": params}, endpoint)
                assert openai_error(r, 400)["param"] == "kv_transfer_params"
        with pytest.raises(TimeoutError):
            trap.accept()  # no engine was sent to the client's address


@pytest.mark.parametrize("prompt", [SHORT_PROMPT, LONG_PROMPT], ids=["colocated", "disagg"])
@pytest.mark.parametrize("stream", [False, True])
def test_answers_carry_no_kv_transfer_params(ctl: ControllerProc, prompt: str,
                                             stream: bool) -> None:
    rid = f"no-kv-{len(prompt)}-{stream}"
    r = post(ctl, {"model": MODEL, "prompt": prompt, "max_tokens": 3, "stream": stream},
             rid=rid)
    assert r.status_code == 200, r.text
    assert b"kv_transfer_params" not in r.content
    want = "disaggregated" if prompt is LONG_PROMPT else "colocated"
    assert record(ctl, rid)["path"] == want
    chat = post(ctl, {"model": MODEL, "max_tokens": 3, "stream": stream,
                      "messages": [{"role": "user", "content": prompt}]},
                "/v1/chat/completions")
    assert chat.status_code == 200 and b"kv_transfer_params" not in chat.content


# ---- finding 5: nothing reaches a prefill engine for a request the decode side refuses ------


def test_refused_requests_run_no_prefill_and_hold_no_kv(ctl: ControllerProc) -> None:
    before = engine_counter(ctl, "prefill", "vllm:prompt_tokens_total")
    huge = "word " * 10_000  # over the model's 8,192-token context by itself
    for i in range(80):
        bad = ({"max_tokens": -1}, {"max_tokens": 0}, {"max_tokens": 10**9},
               {"prompt": huge})[i % 4]
        r = post(ctl, {"model": MODEL, "prompt": LONG_PROMPT, **bad}, rid=f"refused-{i}")
        assert r.status_code == 400, r.text
    assert engine_counter(ctl, "prefill", "vllm:prompt_tokens_total") == before
    assert all(record(ctl, f"refused-{i}")["prefill_instance"] is None for i in (0, 1, 2, 3))
    t0 = time.monotonic()
    r = post(ctl, {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 2}, rid="after-refused")
    assert r.status_code == 200 and time.monotonic() - t0 < 10
    assert record(ctl, "after-refused")["path"] == "disaggregated"
    kv = [i["load"]["kv_cache_usage"] for i in ctl.get("/instances", role="prefill")]
    assert max(kv) < 0.05, kv


# ---- finding 6: control writes are serialised -----------------------------------------------


def stored(ctl: ControllerProc, key: str) -> Any:
    with sqlite3.connect(f"file:{ctl.state_dir / 'state.db'}?mode=ro", uri=True) as db:
        row = db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
    return orjson.loads(row[0])


def test_concurrent_pool_and_routing_changes_agree_everywhere(ctl: ControllerProc) -> None:
    start = time.time()
    try:
        for round_ in range(7):
            sizes = [(round_ + k) % 3 for k in range(10)]
            thresholds = [100 + 10 * round_ + k for k in range(10)]
            calls = [("/pools/prefill", {"size": n}) for n in sizes] + [
                ("/routing", {"disagg_min_prompt_tokens": t}) for t in thresholds]
            with ThreadPoolExecutor(20) as pool:
                answers = list(pool.map(lambda c: ctl.api("PATCH", *c), calls))
            assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
            api_size = ctl.get("/pools/prefill")["desired"]["size"]
            last = events(ctl, "pool.update")[-1]
            assert api_size == stored(ctl, "desired")["prefill"]["size"] == last["after"]["size"]
            api_t = ctl.get("/routing")["disagg_min_prompt_tokens"]
            last_r = events(ctl, "routing.update")[-1]
            assert api_t == stored(ctl, "routing")["disagg_min_prompt_tokens"]
            if last_r["ts"] >= start:
                assert last_r["after"]["disagg_min_prompt_tokens"] == api_t
        # The audit log is a chain: each change starts from the previous one's result.
        mine = [e for e in events(ctl, "pool.update") if e["ts"] >= start]
        assert len(mine) >= 7
        for prev, nxt in zip(mine, mine[1:], strict=False):
            assert nxt["before"] == prev["after"], (prev, nxt)
    finally:
        assert ctl.api("PATCH", "/pools/prefill", {"size": 1}).status_code == 200
        assert ctl.api("PATCH", "/routing", {"disagg_min_prompt_tokens": 64}).status_code == 200
        ctl.wait_converged(60)


# ---- finding 8: strict bodies, every refusal 422 with its field, nothing changed --------------


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/pools/prefill", {"size": "2"}, "size"),
    ("/pools/prefill", {"size": 2.5}, "size"),  # 2.0 is the integer 2 (JSON Schema)
    ("/pools/prefill", {"size": True}, "size"),
    ("/pools/prefill", {"tp": "4"}, "tp"),
    ("/pools/prefill", {"size": -1}, "size"),
    ("/pools/prefill", b'{"size": 1180591620717411303424}', "size"),
    ("/pools/prefill", {"replicas": 2}, "replicas"),
    ("/pools/prefill", {}, None),
    ("/routing", {"max_attempts": True}, "max_attempts"),
    ("/routing", b'{"request_timeout_s": 1e999}', "infinity"),  # refused as JSON
    ("/routing", {"request_timeout_s": "5"}, "request_timeout_s"),
    ("/routing", {"request_timeout_s": 0}, "request_timeout_s"),
    ("/routing", {"transfer_alert_share": 2}, "transfer_alert_share"),
    ("/routing", {"prefill_policy": "random"}, "prefill_policy"),
    ("/routing", {"max_inflight": -1}, "max_inflight"),
    ("/routing", {"disagg_min_prompt_tokens": 1.5}, "disagg_min_prompt_tokens"),
    ("/routing", {"nope": 1}, "nope"),
    ("/routing", {}, None),
])
def test_invalid_change_is_422_with_its_field_and_changes_nothing(
        ctl: ControllerProc, path: str, body: dict[str, Any] | bytes, field: str | None
) -> None:
    before = (ctl.get("/routing"), ctl.get("/pools/prefill")["desired"], len(events(ctl)))
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    r = httpx.patch(f"{ctl.url}/api/v1{path}", content=raw, timeout=10,
                    headers={**JSON, "authorization": f"Bearer {ctl.token}"})
    assert r.status_code == 422, r.text
    if field:
        assert field in r.json()["detail"]
    assert (ctl.get("/routing"), ctl.get("/pools/prefill")["desired"],
            len(events(ctl))) == before


def test_unparseable_or_mistyped_control_bodies(ctl: ControllerProc) -> None:
    auth = {"authorization": f"Bearer {ctl.token}"}
    for content in (b"{not json", b"", b"[1]", b"null"):
        r = httpx.patch(f"{ctl.url}/api/v1/routing", content=content,
                        headers={**JSON, **auth}, timeout=10)
        assert r.status_code == 422, (content, r.text)
        assert isinstance(r.json()["detail"], str)
    r = httpx.patch(f"{ctl.url}/api/v1/routing", content=b'{"max_attempts": 2}',
                    headers={"content-type": "text/plain", **auth}, timeout=10)
    assert r.status_code == 415 and "application/json" in r.json()["detail"]
    r = httpx.patch(f"{ctl.url}/api/v1/routing", content=b'{"max_attempts": 2}',
                    headers=auth, timeout=10)
    assert r.status_code == 415


def test_openapi_documents_the_error_answers(ctl: ControllerProc) -> None:
    doc = httpx.get(f"{ctl.url}/openapi.json", timeout=10).json()
    op = doc["paths"]["/api/v1/routing"]["patch"]
    for status in ("401", "415", "422"):
        ref = op["responses"][status]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/ErrorPublic")
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "HTTPValidationError" not in doc["components"]["schemas"]


# ---- admission control --------------------------------------------------------------------


def slow(ctl: ControllerProc, rid: str) -> httpx.Response:
    return post(ctl, {"model": MODEL, "prompt": SHORT_PROMPT, "max_tokens": 150,
                      "ignore_eos": True}, rid=rid)


@pytest.mark.parametrize("limit", ["max_inflight", "max_inflight_per_instance"])
def test_requests_over_the_limit_get_429_at_once(ctl: ControllerProc, limit: str) -> None:
    assert ctl.api("PATCH", "/routing", {limit: 2}).status_code == 200
    try:
        results: dict[str, httpx.Response] = {}
        threads = [threading.Thread(target=lambda k=k: results.__setitem__(
            f"{limit}-{k}", slow(ctl, f"{limit}-{k}"))) for k in range(2)]
        for t in threads:
            t.start()
        ctl.wait(lambda: ctl.get("/stats")["admission"]["inflight"] == 2, 10, "2 in flight")
        t0 = time.monotonic()
        r = slow(ctl, f"{limit}-over")
        assert time.monotonic() - t0 < 1.0
        err = openai_error(r, 429)
        assert err["type"] == "rate_limit_exceeded" and limit in err["message"]
        assert r.headers["retry-after"] == "1"
        for t in threads:
            t.join()
        assert all(x.status_code == 200 for x in results.values())
        assert record(ctl, f"{limit}-over")["status"] == "rejected"
        stats = ctl.get("/stats")["admission"]
        assert stats[limit] == 2 and stats["refused_total"] >= 1 and stats["inflight"] == 0
        page = prom.parse(ctl.metrics_text())
        assert page.sum("pdctl_admission_refused_total") >= 1
        gauge = ("pdctl_inflight_limit" if limit == "max_inflight"
                 else "pdctl_inflight_per_instance_limit")
        assert page.sum(gauge) == 2
    finally:
        assert ctl.api("PATCH", "/routing", {limit: 1024 if limit == "max_inflight" else 0}
                       ).status_code == 200
