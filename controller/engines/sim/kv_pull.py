"""The decode side of the simulated NIXL handshake: ask the prefill engine for a KV handle.

The simulator's "side channel" is the prefill engine's own HTTP port: ``POST /sim/kv/pull``
answers the prompt length and KV bytes and frees the handle, or 404 when the handle is
unknown, expired or belongs to another engine id. The transfer time itself is modelled by
the caller from the bytes and the link profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from controller.engines.sim.protocol import RemoteKv

PULL_PATH = "/sim/kv/pull"
PULL_TIMEOUT_S = 10.0


class KvPullError(Exception):
    """The KV could not be pulled; ``reason`` says why in words for the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class PullResult:
    prompt_tokens: int
    kv_bytes: int


def pull_url(host: str, port: int) -> str:
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal
    return f"http://{host}:{port}{PULL_PATH}"


class KvPuller:
    """Pulls KV handles over HTTP with one pooled client (created on first use)."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(transport=self._transport, timeout=PULL_TIMEOUT_S)
        return self._client

    async def pull(self, remote: RemoteKv) -> PullResult:
        where = f"{remote.host}:{remote.port}"
        body = {"remote_request_id": remote.request_id, "remote_engine_id": remote.engine_id,
                "remote_block_ids": remote.block_ids}
        try:
            resp = await self._http().post(pull_url(remote.host, remote.port), json=body)
        except httpx.HTTPError as exc:
            raise KvPullError(f"prefill engine {where} unreachable "
                              f"({type(exc).__name__}: {exc})") from exc
        if resp.status_code == 404:
            raise KvPullError(f"KV handle {remote.request_id!r} unknown or expired on engine "
                              f"{remote.engine_id!r} at {where}")
        if resp.status_code != 200:
            raise KvPullError(f"prefill engine {where} answered HTTP {resp.status_code}")
        try:
            data = resp.json()
            return PullResult(int(data["prompt_tokens"]), int(data["kv_bytes"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise KvPullError(f"prefill engine {where} sent a malformed answer: {exc}") from exc

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
