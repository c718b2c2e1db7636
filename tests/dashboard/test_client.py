"""The REST client: one error type with the status and the API's detail, request shapes."""

from __future__ import annotations

import httpx
import pytest

from dashboard.client import ApiError, ControllerClient
from tests.dashboard.fake import TOKEN, URL, FakeController


def test_reads_return_the_api_json(fake: FakeController) -> None:
    with_client = fake.client()
    assert with_client.cluster()["pools"]["decode"]["desired"] == {"size": 1, "tp": 2}
    assert with_client.stats(60)["requests"] == 300
    assert len(with_client.requests(50)) == 50
    assert with_client.timeseries(60, 5)["step_s"] == 5
    assert with_client.events(10)[0]["kind"] == "pool.update"
    with_client.close()


def test_reads_carry_the_kv_integrity_and_quarantine_fields(fake: FakeController) -> None:
    c = fake.client()
    assert c.stats(60)["kv_integrity"]["alert"] is False
    assert c.cluster()["pools"]["prefill"]["quarantine"] is None
    assert {"kv_handle", "suspect"} <= set(c.requests(5)[0])
    nixl = c.cluster()["instances"][0]["nixl"]
    assert {"kv_expired_requests", "notifications_after_expiry"} <= set(nixl)
    c.close()


def test_sends_token_actor_and_params() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=[])

    c = ControllerClient(URL + "/", "tok", transport=httpx.MockTransport(handler))
    c.requests(25)
    c.events(5, kind="pool.update")
    assert str(seen[0].url) == f"{URL}/api/v1/requests?limit=25"
    assert seen[0].headers["authorization"] == "Bearer tok"
    assert seen[0].headers["x-pdctl-actor"] == "pdctl-console"
    assert seen[1].url.params["kind"] == "pool.update"
    c.close()


def test_refused_change_carries_status_and_detail(fake: FakeController) -> None:
    c = fake.client()
    with pytest.raises(ApiError) as info:
        c.set_pool("decode", tp=3)
    assert info.value.status == 422
    assert info.value.detail == "TP 3 does not divide llama-3-70b's 64 attention heads"
    assert info.value.refused and not info.value.unreachable
    c.close()


def test_wrong_token_is_401(fake: FakeController) -> None:
    c = fake.client("wrong")
    with pytest.raises(ApiError) as info:
        c.cluster()
    assert info.value.unauthorized
    assert info.value.detail == "missing or invalid bearer token (see STATE_DIR/token)"
    c.close()


def test_unreachable_has_no_status(fake: FakeController) -> None:
    fake.reachable = False
    c = fake.client()
    with pytest.raises(ApiError) as info:
        c.routing()
    assert info.value.status is None and info.value.unreachable
    assert "ConnectError" in info.value.detail
    c.close()


def test_real_refused_connection_is_unreachable() -> None:
    c = ControllerClient("http://127.0.0.1:9", TOKEN, timeout_s=1.0)
    with pytest.raises(ApiError) as info:
        c.cluster()
    assert info.value.unreachable
    c.close()


def test_no_token_sends_nothing() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("sent a request without a token")

    c = ControllerClient(URL, None, transport=httpx.MockTransport(handler))
    with pytest.raises(ApiError, match="no API token"):
        c.cluster()
    c.close()


def test_non_json_error_body_is_kept() -> None:
    c = ControllerClient(URL, "t", transport=httpx.MockTransport(
        lambda r: httpx.Response(502, text="bad gateway")))
    with pytest.raises(ApiError) as info:
        c.cluster()
    assert (info.value.status, info.value.detail) == (502, "bad gateway")
    c.close()


def test_drain_unknown_instance_is_404(fake: FakeController) -> None:
    c = fake.client()
    with pytest.raises(ApiError) as info:
        c.drain("nope")
    assert info.value.status == 404 and info.value.refused
    c.close()
