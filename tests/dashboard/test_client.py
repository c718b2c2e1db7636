"""The console's client (``pdctl_api``'s, as ``pdctl-console``): typed answers, one error type
with the status and the API's detail, request shapes."""

from __future__ import annotations

import time

import httpx
import pytest

from dashboard.client import ApiError, ControllerClient
from pdctl_api.schema import CachePublic, PoolSize, Role
from tests.dashboard.fake import TOKEN, URL, FakeController, make_records, with_cache


def test_reads_return_the_api_models(fake: FakeController) -> None:
    with_client = fake.client()
    assert with_client.cluster().pools[Role.DECODE].desired == PoolSize(size=1, tp=2)
    assert with_client.stats(60).requests == 300
    assert len(with_client.requests(50)) == 50
    assert with_client.timeseries(60, 5).step_s == 5
    assert with_client.events(10)[0].kind == "pool.update"
    with_client.close()


def test_reads_carry_the_kv_integrity_and_quarantine_fields(fake: FakeController) -> None:
    c = fake.client()
    k = c.stats(60).kv_integrity
    assert k is not None and k.alert is False
    assert c.cluster().pools[Role.PREFILL].quarantine is None
    assert c.requests(5)[0].kv_handle
    nixl = c.cluster().instances[0].nixl
    assert nixl.kv_expired_requests == 0.0 and nixl.notifications_after_expiry == 0.0
    c.close()


def test_an_older_controller_reads_with_defaults(fake: FakeController) -> None:
    fake.legacy = True
    c = fake.client()
    assert c.stats(60).kv_integrity is None
    assert c.cluster().pools[Role.PREFILL].quarantine is None
    r = c.requests(5)[0]
    assert r.kv_handle is None and r.suspect is False
    assert c.cluster().instances[0].nixl.kv_expired_requests is None
    c.close()


def test_an_answer_that_breaks_the_contract_is_an_api_error() -> None:
    c = ControllerClient(URL, "t", transport=httpx.MockTransport(
        lambda r: httpx.Response(200, json={"window_s": 60})))
    with pytest.raises(ApiError) as info:
        c.stats(60)
    assert info.value.status == 200
    assert info.value.detail.startswith("unexpected answer to GET /api/v1/stats: requests:")
    c.close()


def test_dry_run_of_a_pool_change_changes_nothing(fake: FakeController) -> None:
    c = fake.client()
    plan = c.plan_pool("decode", size=3)
    assert plan.role is Role.DECODE and plan.desired == PoolSize(size=3, tp=2)
    assert [(a.kind, a.role, a.tp) for a in plan.actions] == [("start", Role.DECODE, 2)] * 2
    assert fake.changes() == [] and fake.targets[Role.DECODE].size == 1
    assert fake.dry_runs() == [("PATCH", "/api/v1/pools/decode?dry_run=true", {"size": 3})]
    with pytest.raises(ApiError) as info:
        c.plan_pool("decode", tp=3)
    assert info.value.status == 422 and "does not divide" in info.value.detail
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


def test_the_field_of_a_refusal_is_kept() -> None:
    c = ControllerClient(URL, "t", transport=httpx.MockTransport(
        lambda r: httpx.Response(422, json={"detail": "size: too big", "field": "size"})))
    with pytest.raises(ApiError) as info:
        c.set_pool(Role.DECODE, size=10**6)
    assert (info.value.status, info.value.detail, info.value.field) == (422, "size: too big",
                                                                        "size")
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


def test_the_prefix_cache_reads_typed_and_fails_as_every_read(fake: FakeController) -> None:
    seen: list[httpx.Request] = []

    def handle(r: httpx.Request) -> httpx.Response:
        seen.append(r)
        return fake.handle(r)

    fake.records = with_cache(make_records(300))
    c = ControllerClient(URL, TOKEN, transport=httpx.MockTransport(handle))
    answer = c.cache(120, 10, end=time.time())
    assert isinstance(answer, CachePublic) and answer.step_s == 10 and len(answer.buckets) == 12
    assert answer.hit_rate == pytest.approx(0.4) and answer.predicted_hit_rate == \
        pytest.approx(0.45)
    assert {i.instance for i in answer.instances} == {"prefill-1", "decode-2"}
    assert seen[-1].url.path == "/api/v1/cache" and "end" in seen[-1].url.params
    fake.legacy = True
    with pytest.raises(ApiError) as info:
        c.cache()
    assert info.value.status == 404  # an older controller: the pages say so
    fake.reachable = False
    with pytest.raises(ApiError) as down:
        c.cache()
    assert down.value.unreachable
    c.close()
