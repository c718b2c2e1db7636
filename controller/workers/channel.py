"""The brain <-> worker channel: messages as length-prefixed JSON over a Unix socket.

A message is a JSON object with ``t`` naming its kind. Worker to brain: ``hello`` (its
index and pid), ``events`` (a batch: admissions, decode hops, records, unreachable engines,
in order), ``load`` (its counts by instance, totals), ``metrics`` (its samples). Brain to
worker: ``routing`` (live routing settings and service targets), ``members`` (a pool's
ready instances), ``failed`` (an instance written off), ``others`` (the rest of the fleet's
load)."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import fields
from typing import Any

import orjson

from controller.models import Instance, InstanceState, RequestPath, RequestRecord, Role

_LEN = struct.Struct("!I")
MAX_MESSAGE = 64 * 1024 * 1024


class ChannelClosed(Exception):
    """The other end went away."""


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    try:
        head = await reader.readexactly(_LEN.size)
        (n,) = _LEN.unpack(head)
        if n > MAX_MESSAGE:
            raise ChannelClosed(f"message of {n} bytes: over the channel's limit")
        msg = orjson.loads(await reader.readexactly(n))
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise ChannelClosed(str(exc) or type(exc).__name__) from None
    if not isinstance(msg, dict):
        raise ChannelClosed("a message that is not an object")
    return msg


def frame(msg: dict[str, Any]) -> bytes:
    body = orjson.dumps(msg, option=orjson.OPT_NON_STR_KEYS)
    return _LEN.pack(len(body)) + body


# ---- values on the wire -----------------------------------------------------------------

def instance_wire(inst: Instance) -> dict[str, Any]:
    """What a worker needs of an instance: every field but the launcher's handle, plus the
    KV-event endpoints the handle names (a worker subscribes to them itself)."""
    out = {f.name: getattr(inst, f.name) for f in fields(Instance) if f.name != "handle"}
    out["kv_events"] = getattr(inst.handle, "kv_events", None)
    return out


def instance_from(d: dict[str, Any]) -> tuple[Instance, tuple[str, str] | None]:
    d = dict(d)
    events = d.pop("kv_events", None)
    d["role"], d["state"] = Role(d["role"]), InstanceState(d["state"])
    d["accelerators"], d["slots"] = tuple(d["accelerators"]), tuple(d["slots"])
    return Instance(**d), ((events[0], events[1]) if events else None)


def record_wire(rec: RequestRecord) -> dict[str, Any]:
    return {f.name: getattr(rec, f.name) for f in fields(RequestRecord)}


def record_from(d: dict[str, Any]) -> RequestRecord:
    return RequestRecord(**{**d, "path": RequestPath(d["path"])})
