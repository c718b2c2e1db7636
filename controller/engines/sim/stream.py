"""``RequestStream``: what the engine tells one request's HTTP handler, and when.

The engine loop writes token counts and wall times; the handler awaits ``done`` (one wake-up
per request) or, when streaming, ``progress`` (one wake-up per step that produced a token).
"""

from __future__ import annotations

import asyncio

from controller.engines.sim.protocol import EngineError


class RequestStream:
    __slots__ = ("seq_id", "arrival", "streaming", "scheduled_at", "first_token_at",
                 "last_token_at", "kv_transfer_s", "num_tokens", "error", "handle_blocks",
                 "cached_tokens",
                 "done", "_waiter")

    def __init__(self, seq_id: str, arrival: float, streaming: bool) -> None:
        self.seq_id = seq_id
        self.arrival = arrival
        self.streaming = streaming
        self.scheduled_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.kv_transfer_s = 0.0
        self.num_tokens = 0
        self.error: EngineError | None = None
        self.handle_blocks: list[int] | None = None  # a prefill hop's KV, kept for a puller
        self.cached_tokens = 0  # prompt tokens not computed here (vLLM's num_cached_tokens)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter: asyncio.Future[None] | None = None

    @property
    def finished(self) -> bool:
        return self.done.done()

    # ---- engine side ------------------------------------------------------------------

    def token(self, now: float) -> float | None:
        """Record one token at ``now``; returns the gap since the previous token, if any."""
        gap = None if self.last_token_at is None else now - self.last_token_at
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.num_tokens += 1
        if self.streaming:
            self._wake()
        return gap

    def finish(self, error: EngineError | None = None) -> None:
        self.error = error
        if not self.done.done():
            self.done.set_result(None)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ---- handler side -----------------------------------------------------------------

    async def progress(self, seen: int) -> None:
        """Return once more than ``seen`` tokens exist or the request is over."""
        while self.num_tokens <= seen and not self.finished:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
