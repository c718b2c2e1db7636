"""The client side of the simulated NIXL side channel: pull, release, heartbeat, and push mode's
register and pushed calls.

The simulator's "side channel" is the prefill engine's own HTTP port:

- ``POST /sim/kv/pull`` reads a KV handle: it answers the prompt length and the KV bytes of
  the blocks read and frees the handle. The blocks read are the tail of the handle's (a
  decode engine reads only the blocks its own prefix cache lacks; none is a
  notification-only read). A handle the prefill no longer tracks (its lease expired, it was read or
  released already) still answers 200, with ``{"stale": true}``: vLLM's decode reads raw
  blocks and only the prefill notices. Only a wrong engine id (vLLM's handshake fails) or a
  prefill that cannot be reached fails the pull.
- ``POST /sim/kv/release`` is vLLM's notification-only read: it frees a handle the decode
  engine will not read (its request was rejected or aborted before the pull).
- ``POST /sim/kv/heartbeat`` renews the leases of handles a decode engine still waits on.

Push mode (vLLM 0.32's NixlPushConnector, see ``push``) adds two calls:

- ``POST /sim/kv/register`` (decode -> prefill): the decode engine allocated blocks for a
  request and asks the prefill to write its KV there (vLLM's PUSH_REG notification). Only a
  wrong engine id, a prefill not in push mode, or a prefill that cannot be reached fails it
  (vLLM's registration handshake fails).
- ``POST /sim/kv/pushed`` (prefill -> decode): the prefill's write into those blocks is
  complete (vLLM's completion notification to the decode worker).

The transfer time itself is modelled by the caller from the bytes and the link profile.
An engine that lives in the same process (a sim host's engines) is called directly
(``peers``): the same calls, without HTTP. ``unreachable`` (the fault knob) makes every call
fail as if no peer answered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from controller.engines.sim.protocol import RemoteKv
from controller.engines.sim.push import Pushed, Registration

PULL_PATH = "/sim/kv/pull"
RELEASE_PATH = "/sim/kv/release"
HEARTBEAT_PATH = "/sim/kv/heartbeat"
REGISTER_PATH = "/sim/kv/register"
PUSHED_PATH = "/sim/kv/pushed"
PULL_TIMEOUT_S = 10.0


class KvRefused(Exception):
    """The side channel refuses a call: another engine id, or other blocks than the handle's.

    vLLM's handshake with a wrong engine fails; the decode engine's pull fails loudly.
    """


class SideChannel(Protocol):
    """The prefill side of the calls, as an engine in this process serves them."""

    def serve_pull(self, seq_id: str, engine_id: str, block_ids: list[int]
                   ) -> PullResult | None: ...

    def serve_release(self, seq_id: str, engine_id: str) -> bool: ...

    def serve_heartbeat(self, engine_id: str, seq_ids: list[str]) -> int: ...

    def serve_register(self, reg: Registration) -> bool: ...

    def serve_pushed(self, done: Pushed) -> bool: ...


Peers = Callable[[str, int], "SideChannel | None"]


class KvPullError(Exception):
    """The KV could not be pulled; ``reason`` says why in words for the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class PullResult:
    prompt_tokens: int
    kv_bytes: int
    stale: bool = False  # the prefill no longer tracked the handle: sizes are unknown (0)


def advertised_host(host: str) -> str:
    """The host other engines dial for KV: a wildcard bind is reached on loopback."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def kv_url(host: str, port: int, path: str) -> str:
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal
    return f"http://{host}:{port}{path}"


def pull_url(host: str, port: int) -> str:
    return kv_url(host, port, PULL_PATH)


def _detail(resp: httpx.Response) -> str:
    """The prefill's error message, or the status when the body is not its error shape."""
    try:
        message = resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {resp.status_code}"
    return str(message)


class KvPuller:
    """Talks to prefill engines' side channels with one pooled client (created on first use)."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None,
                 peers: Peers | None = None) -> None:
        self._transport = transport
        self._peers = peers
        self._client: httpx.AsyncClient | None = None
        self.unreachable = False  # the fault knob: no side channel answers

    def _peer(self, host: str, port: int) -> SideChannel | None:
        if self.unreachable:
            raise KvPullError(f"prefill engine {host}:{port} unreachable (fault injected: "
                              "kv_unreachable)")
        return None if self._peers is None else self._peers(host, port)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(transport=self._transport, timeout=PULL_TIMEOUT_S)
        return self._client

    async def pull(self, remote: RemoteKv, block_ids: list[int] | None = None) -> PullResult:
        """Read ``block_ids`` (the tail of the handle's; default: all of them)."""
        where = f"{remote.host}:{remote.port}"
        blocks = remote.block_ids if block_ids is None else block_ids
        peer = self._peer(remote.host, remote.port)
        if peer is not None:
            try:
                result = peer.serve_pull(remote.request_id, remote.engine_id, blocks)
            except KvRefused as exc:
                raise KvPullError(f"KV handshake with engine {remote.engine_id!r} at {where} "
                                  f"failed: {exc}") from exc
            return PullResult(0, 0, stale=True) if result is None else result
        body = {"remote_request_id": remote.request_id, "remote_engine_id": remote.engine_id,
                "remote_block_ids": blocks}
        resp = await self._handshake(pull_url(remote.host, remote.port), body, where,
                                     remote.engine_id)
        try:
            data = resp.json()
            if data.get("stale") is True:
                return PullResult(0, 0, stale=True)
            return PullResult(int(data["prompt_tokens"]), int(data["kv_bytes"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KvPullError(f"prefill engine {where} sent a malformed answer: {exc}") from exc

    async def release(self, remote: RemoteKv) -> None:
        """Tell the prefill its handle will not be read; ``KvPullError`` if that failed."""
        peer = self._peer(remote.host, remote.port)
        if peer is not None:
            self._local(peer.serve_release, remote.host, remote.port, RELEASE_PATH,
                        remote.request_id, remote.engine_id)
            return
        body = {"remote_request_id": remote.request_id, "remote_engine_id": remote.engine_id}
        await self._notify(remote.host, remote.port, RELEASE_PATH, body, PULL_TIMEOUT_S)

    async def heartbeat(self, host: str, port: int, engine_id: str, request_ids: list[str],
                        timeout_s: float) -> None:
        """Renew the leases of ``request_ids`` on one prefill; ``KvPullError`` on failure."""
        peer = self._peer(host, port)
        if peer is not None:
            self._local(peer.serve_heartbeat, host, port, HEARTBEAT_PATH, engine_id,
                        request_ids)
            return
        body = {"remote_engine_id": engine_id, "request_ids": request_ids}
        await self._notify(host, port, HEARTBEAT_PATH, body, timeout_s)

    async def register(self, reg: Registration) -> None:
        """Ask the prefill at ``reg.remote_host:port`` to write ``reg``'s KV (push mode);
        ``KvPullError`` if the handshake failed or it cannot be reached."""
        peer = self._peer(reg.remote_host, reg.remote_port)
        if peer is not None:
            try:
                peer.serve_register(reg)
            except KvRefused as exc:
                raise KvPullError(f"KV handshake with engine {reg.remote_engine_id!r} at "
                                  f"{reg.remote_host}:{reg.remote_port} failed: {exc}") from exc
            return
        await self._handshake(kv_url(reg.remote_host, reg.remote_port, REGISTER_PATH),
                              reg.body(), f"{reg.remote_host}:{reg.remote_port}",
                              reg.remote_engine_id)

    async def _handshake(self, url: str, body: dict[str, Any], where: str,
                         engine_id: str) -> httpx.Response:
        """POST a pull or a registration to a prefill engine: its 200 answer, or
        ``KvPullError`` (unreachable, a failed handshake -- 404: not that engine -- or
        another status)."""
        try:
            resp = await self._http().post(url, json=body)
        except httpx.HTTPError as exc:
            raise KvPullError(f"prefill engine {where} unreachable "
                              f"({type(exc).__name__}: {exc})") from exc
        if resp.status_code == 404:
            raise KvPullError(f"KV handshake with engine {engine_id!r} at {where} "
                              f"failed: {_detail(resp)}")
        if resp.status_code != 200:
            raise KvPullError(f"prefill engine {where} answered HTTP {resp.status_code}")
        return resp

    async def pushed(self, reg: Registration, done: Pushed) -> None:
        """Tell the decode engine that registered ``reg`` its KV was written (push mode);
        ``KvPullError`` on failure. Not subject to the fault knob (a prefill's call)."""
        peer = None if self._peers is None else self._peers(reg.decode_host, reg.decode_port)
        if peer is not None:
            self._local(peer.serve_pushed, reg.decode_host, reg.decode_port, PUSHED_PATH, done)
            return
        await self._notify(reg.decode_host, reg.decode_port, PUSHED_PATH, done.body(),
                           PULL_TIMEOUT_S)

    @staticmethod
    def _local(call: Callable[..., Any], host: str, port: int, path: str, *args: Any) -> None:
        try:
            call(*args)
        except KvRefused as exc:
            raise KvPullError(f"prefill engine {host}:{port} refused {path}: {exc}") from exc

    async def _notify(self, host: str, port: int, path: str, body: dict[str, Any],
                      timeout_s: float) -> None:
        where = f"{host}:{port}"
        try:
            resp = await self._http().post(kv_url(host, port, path), json=body,
                                           timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise KvPullError(f"prefill engine {where} unreachable "
                              f"({type(exc).__name__}: {exc})") from exc
        if resp.status_code != 200:
            raise KvPullError(f"prefill engine {where} refused {path}: {_detail(resp)}")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
