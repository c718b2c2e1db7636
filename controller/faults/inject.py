"""The faults themselves, from the operator's side of the machine: signals to an engine's
process tree (which must run on this host) and a rolling TP change through the API."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

#: The faults, each a name the command line takes. A kill and a stall pick the ready instance
#: of the role with the lowest id.
FAULT_SCENARIOS: dict[str, str] = {
    "kill-prefill": "SIGKILL a ready prefill engine's process tree (hops mid-transfer)",
    "kill-decode": "SIGKILL a ready decode engine's process tree (streams mid-flight)",
    "stall-prefill": "SIGSTOP a ready prefill engine past the KV lease, then SIGCONT",
    "tp-change": "a rolling TP change of the prefill pool (1 <-> 2) under load",
    "fill-disk": "fill the state directory's file system (--state-dir: a small one of its "
                 "own) for --hold-s, then free it",
    "restart-controller": "run --restart-cmd (your own way of restarting the controller: "
                          "systemctl, docker compose restart) under load",
}
ROLE = {"kill-prefill": "prefill", "kill-decode": "decode", "stall-prefill": "prefill",
        "tp-change": "prefill", "fill-disk": "controller",
        "restart-controller": "controller"}
BALLAST = ".pdctl-fault-ballast"  # the file that fills the state directory's disk
CHUNK = 1 << 16


class FaultRefused(Exception):
    """The fault cannot be injected here (no ready instance, an engine not on this host)."""


def victim(instances: Sequence[Mapping[str, Any]], role: str) -> Mapping[str, Any]:
    """The ready instance of ``role`` with the lowest id; ``FaultRefused`` when there is none
    or its process is not on this host."""
    ready = sorted((i for i in instances if i["role"] == role and i["state"] == "ready"),
                   key=lambda i: str(i["id"]))
    if not ready:
        raise FaultRefused(f"no ready {role} instance to inject the fault into")
    v = ready[0]
    pid = v.get("pid")
    if not pid:
        raise FaultRefused(f"{v['id']} has no local process id: its engine was not started "
                           "by this controller's local launcher (external or Ray engines), "
                           "so its processes cannot be signalled from here")
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        raise FaultRefused(f"{v['id']}'s process {pid} is not on this host: run `pdctl fault` "
                           "where the controller runs (in a compose lab: "
                           "`docker compose exec controller pdctl fault ...`)") from None
    except PermissionError:
        raise FaultRefused(f"{v['id']}'s process {pid} belongs to another user: run "
                           "`pdctl fault` as the controller's user") from None
    return v


def signal_engine(pid: int, sig: signal.Signals) -> None:
    """``sig`` to the engine's whole process group where it leads one (the launcher starts
    each engine in its own session: API server, engine core, workers), else to ``pid``."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def kill(v: Mapping[str, Any]) -> str:
    pid = int(v["pid"])
    signal_engine(pid, signal.SIGKILL)
    return f"SIGKILL to pid {pid}'s process group"


def stall(v: Mapping[str, Any], seconds: float,
          sleep: Callable[[float], None] = time.sleep) -> str:
    """Stopped for ``seconds``, then continued (continued however the wait ends)."""
    pid = int(v["pid"])
    signal_engine(pid, signal.SIGSTOP)
    try:
        sleep(seconds)
    finally:
        signal_engine(pid, signal.SIGCONT)
    return f"SIGSTOP to pid {pid}'s process group for {seconds:g} s, then SIGCONT"


def other_tp(tp: int) -> int:
    return 2 if tp == 1 else 1


def fill_filesystem(directory: Path, max_bytes: int) -> Path:
    """A file in ``directory`` taking every free byte of its file system; ``FaultRefused``
    when that file system is larger than ``max_bytes`` (filling it would fill the machine's
    disk) or is not writable."""
    st = os.statvfs(directory)
    size = st.f_blocks * st.f_frsize
    if size > max_bytes:
        raise FaultRefused(
            f"{directory} is on a file system of {size / 2**20:,.0f} MiB, over the "
            f"{max_bytes / 2**20:,.0f} MiB this fault fills (--max-fill-mb): filling it would "
            "fill the machine's disk. Rehearse a full disk with the controller's state "
            "directory on a small file system of its own (e.g. mount -t tmpfs -o size=64m "
            "tmpfs DIR before the controller starts)")
    ballast = directory / BALLAST
    zeros = b"\0" * CHUNK
    try:
        with ballast.open("wb", buffering=0) as f:  # unbuffered: a failed write leaves nothing
            for n in (CHUNK, 1):  # whole chunks, then the last bytes
                _write_until_full(f, zeros[:n])
    except OSError as exc:
        ballast.unlink(missing_ok=True)
        raise FaultRefused(f"cannot fill {directory}: {exc}") from None
    return ballast


def _write_until_full(f: BinaryIO, data: bytes) -> None:
    try:
        while f.write(data):
            pass
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
