"""The side channel's endpoints (pull, release, heartbeat) answer a malformed body with a 400
in OpenAI's error shape, never a 500."""

from __future__ import annotations

import pytest

from tests.unit.sim_lease.harness import pair

ANY = ["/sim/kv/pull", "/sim/kv/release", "/sim/kv/heartbeat"]
PULL_RELEASE = ["/sim/kv/pull", "/sim/kv/release"]


@pytest.mark.parametrize(("path", "content"), [
    *((path, content) for path in ANY
      for content in (b"{not json", b"[]", b"null", b'"x"', b"{}", b'{"remote_engine_id": {}}')),
    *((path, content) for path in PULL_RELEASE for content in (
        b'{"remote_request_id": 5, "remote_engine_id": "P", "remote_block_ids": [1]}',
        b'{"remote_request_id": ["a"], "remote_engine_id": "P", "remote_block_ids": [1]}',
        b'{"remote_request_id": "a", "remote_engine_id": null, "remote_block_ids": [1]}',
        b'{"remote_request_id": "a", "remote_block_ids": [1]}')),
    ("/sim/kv/pull", b'{"remote_request_id": "a", "remote_engine_id": "P"}'),
    ("/sim/kv/pull",
     b'{"remote_request_id": "a", "remote_engine_id": "P", "remote_block_ids": ["1"]}'),
    ("/sim/kv/pull",
     b'{"remote_request_id": "a", "remote_engine_id": "P", "remote_block_ids": 3}'),
    ("/sim/kv/heartbeat", b'{"remote_engine_id": "P", "request_ids": "hop-1"}'),
    ("/sim/kv/heartbeat", b'{"remote_engine_id": "P", "request_ids": [1, 2]}'),
    ("/sim/kv/heartbeat", b'{"remote_engine_id": "P"}'),
    ("/sim/kv/heartbeat", b'{"remote_engine_id": 7, "request_ids": []}'),
])
async def test_bad_side_channel_bodies_are_400(path: str, content: bytes) -> None:
    async with pair() as pp:
        r = await pp.prefill.post(path, content=content,
                                  headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "BadRequestError" and err["code"] == 400 and err["message"]


async def test_an_absurdly_nested_body_is_a_400_not_a_500() -> None:
    async with pair() as pp:
        r = await pp.prefill.post("/sim/kv/heartbeat", content=b"[" * 100_000,
                                  headers={"content-type": "application/json"})
        assert r.status_code == 400
