"""Push mode's pure parts: the messages and the prefill's book of registrations, no clock, no I/O.

vLLM 0.32's ``NixlPushConnector`` (``kv_connector/v1/nixl/push_scheduler.py``,
``push_worker.py``) turns the hand-off around: the router sends the prefill hop and the decode
hop at once with the same request id, the decode hop naming the prefill engine but no KV
handle. The decode engine allocates blocks for the part of the prompt its own prefix cache
lacks and *registers* them with the prefill (a ``PUSH_REG`` notification: ``Registration``);
the prefill, once its prefill of the request is done, *writes* its KV into those blocks and
tells the decode engine (``Pushed``), then frees its blocks. Either may come first: a
registration before the prefill finished waits in the prefill's book, a finished prefill
waits (under its KV lease) for the registration.

Registrations are matched to prefills by request id, exact first, then with vLLM's random
``-xxxxxxxx`` suffix stripped from both sides (``nixl/utils.get_base_request_id``): the sim
names a sequence after its X-Request-Id and adds such a suffix only when that id is in use.

``PushBook`` keeps, per base request id, a registration the prefill cannot serve yet and
the ids whose decode hop was released before the prefill finished (so the prefill frees
those blocks when it finishes instead of holding them for the lease). Entries carry a
deadline and are dropped when it passes (``prune``), so nothing leaks when a peer vanishes.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

_RANDOM_SUFFIX_RE = re.compile(r"-[0-9a-f]{8}$", re.IGNORECASE)  # vLLM's, nixl/utils.py


def base_request_id(request_id: str) -> str:
    """``request_id`` without the per-request ``-<8 hex>`` randomization suffix, if any."""
    return _RANDOM_SUFFIX_RE.sub("", request_id)


@dataclass(frozen=True, slots=True)
class Registration:
    """A decode engine's blocks waiting for a prefill's write (vLLM's PUSH_REG payload).

    ``request_id`` is the decode engine's sequence id; ``num_blocks`` the blocks it
    allocated for the prompt's uncached tail (its own prefix-cache hits are not written).
    """

    request_id: str
    remote_engine_id: str  # the prefill's, as the decode hop named it
    remote_host: str
    remote_port: int
    decode_engine_id: str
    decode_host: str
    decode_port: int
    num_blocks: int

    def body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Registration:
        """The registration in ``body``; ``ValueError`` naming the field that is wrong."""
        return cls(*(_field(body, name, kind) for name, kind in _REG_FIELDS))


@dataclass(frozen=True, slots=True)
class Pushed:
    """A prefill's write into a decode engine's registered blocks is complete."""

    request_id: str  # the decode engine's sequence id, as registered
    decode_engine_id: str
    prompt_tokens: int
    num_blocks: int  # blocks written
    kv_bytes: int
    xfer_s: float  # wall seconds the write took

    def body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Pushed:
        """The message in ``body``; ``ValueError`` naming the field that is wrong."""
        return cls(*(_field(body, name, kind) for name, kind in _PUSHED_FIELDS))


_REG_FIELDS: tuple[tuple[str, type], ...] = (
    ("request_id", str), ("remote_engine_id", str), ("remote_host", str),
    ("remote_port", int), ("decode_engine_id", str), ("decode_host", str),
    ("decode_port", int), ("num_blocks", int))
_PUSHED_FIELDS: tuple[tuple[str, type], ...] = (
    ("request_id", str), ("decode_engine_id", str), ("prompt_tokens", int),
    ("num_blocks", int), ("kv_bytes", int), ("xfer_s", float))


def _field(body: dict[str, Any], name: str, kind: type) -> Any:
    if name not in body:
        raise ValueError(f"{name} is missing")
    value = body[name]
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or (kind is int and value < 0):
        raise ValueError(f"{name} must be {'a string' if kind is str else 'a number >= 0'}")
    return float(value) if kind is float else value


class PushBook:
    """The prefill side's registrations waiting for a prefill, and early releases.

    Keyed by base request id; each entry lives until its deadline (``prune``).
    """

    def __init__(self) -> None:
        self._regs: dict[str, tuple[Registration, float]] = {}
        self._released: dict[str, float] = {}

    @property
    def num_registrations(self) -> int:
        return len(self._regs)

    def register(self, reg: Registration, deadline: float) -> None:
        """Keep ``reg`` until a prefill of its request finishes or ``deadline`` passes; a
        later registration of the same request replaces it."""
        key = base_request_id(reg.request_id)
        self._released.pop(key, None)
        self._regs[key] = (reg, deadline)

    def take_registration(self, seq_id: str) -> Registration | None:
        """The registration waiting for the prefill ``seq_id``, removed; None if none."""
        entry = self._regs.pop(base_request_id(seq_id), None)
        return None if entry is None else entry[0]

    def drop_registration(self, request_id: str) -> bool:
        """Forget the registration of ``request_id``'s decode hop; False if there was none."""
        return self._regs.pop(base_request_id(request_id), None) is not None

    def remember_release(self, request_id: str, deadline: float) -> None:
        """The decode hop of ``request_id`` will not take its KV: until ``deadline``, its
        prefill's blocks go as soon as it finishes (``take_released``)."""
        self._released[base_request_id(request_id)] = deadline

    def take_released(self, seq_id: str) -> bool:
        """Whether the decode hop of the prefill ``seq_id`` was released (forgets it)."""
        return self._released.pop(base_request_id(seq_id), None) is not None

    def prune(self, now: float) -> list[Registration]:
        """Drop entries whose deadline passed; returns the registrations dropped."""
        dropped = [reg for reg, deadline in self._regs.values() if deadline <= now]
        for reg in dropped:
            del self._regs[base_request_id(reg.request_id)]
        for key in [k for k, deadline in self._released.items() if deadline <= now]:
            del self._released[key]
        return dropped

    def clear(self) -> None:
        self._regs.clear()
        self._released.clear()


def find_handle(handles: dict[str, Any], request_id: str) -> str | None:
    """The key of ``handles`` that is ``request_id``, else one with the same base id."""
    if request_id in handles:
        return request_id
    base = base_request_id(request_id)
    return next((k for k in handles if base_request_id(k) == base), None)
