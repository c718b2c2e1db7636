"""Local engine processes: each in its own process group, log to a file, stopped as a group.

Stopping sends SIGTERM to the whole group, waits, then SIGKILL, so no child an engine
spawned outlives it. Children also get ``PR_SET_PDEATHSIG`` so that a controller killed with
SIGKILL does not leave engines behind.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from controller.launchers.base import EngineKind, EventPorts, Launched, Launcher, LaunchSpec

PR_SET_PDEATHSIG = 1


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# The lowest port chosen below the ephemeral range: above Ray's default ports (client
# server 10001, workers 10002-19999), which a Ray head on this machine takes for its own.
PORT_FLOOR = 20000
RECENT_PORTS = 512  # ports handed out lately, not handed out again (their engines may be starting)
_recent: collections.deque[int] = collections.deque(maxlen=RECENT_PORTS)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now (see ``free_ports``)."""
    return free_ports(host, 1)[0]


def free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct TCP ports free now on ``host`` (held open together while chosen).

    Chosen below the kernel's ephemeral range where it leaves room: every port a process
    gets by binding port 0 -- vLLM's and torch's own picks inside an engine, ZMQ's -- comes
    from that range, so none can take one of these between their choice and their use (seen:
    a prefill engine's worker took its side-channel port first, and the engine hung at start
    with "Address already in use"). Elsewhere, or when that range leaves no room, the OS's
    choice of a free port."""
    low = _ephemeral_low()
    if low is None or low - PORT_FLOOR < 4 * RECENT_PORTS:
        return _os_ports(host, n)
    rng = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        for _ in range(64 * n):
            if len(socks) == n:
                break
            port = rng.randrange(PORT_FLOOR, low)
            if port in _recent or any(s.getsockname()[1] == port for s in socks):
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        ports = [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
    if len(ports) < n:
        return ports + _os_ports(host, n - len(ports))
    _recent.extend(ports)
    return ports


def _ephemeral_low() -> int | None:
    """The lowest port of the kernel's ephemeral range (Linux), else None."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _os_ports(host: str, n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _child_setup(nice: int) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if nice:
        os.nice(nice)  # inherited by every thread and child the engine starts


def spawn(argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
          nice: int = 0) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group, output to ``log_path``, ``nice`` added to its
    niceness."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, start_new_session=True,
            preexec_fn=partial(_child_setup, nice),  # noqa: PLW1509 - needed for PDEATHSIG
        )


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group, then SIGKILL it if it has not exited within ``grace_s``."""
    signal_group(proc, signal.SIGTERM)
    deadline = asyncio.get_running_loop().time() + grace_s
    while proc.poll() is None and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    signal_group(proc, signal.SIGKILL)  # also reaps grandchildren that ignored SIGTERM
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def stop_group_sync(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """``stop_group`` for code that has no event loop."""
    signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    signal_group(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def stop_leftover(pid: int, port: int) -> str:
    """A previous controller run's engine, found by pid: ``gone``, or ``stopped`` (SIGKILL to
    its process group) when pid is still an engine listening on ``port`` by its command line
    (``--port N``), or ``not ours`` when the pid now belongs to something else."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return "gone"
    flag = [i for i, a in enumerate(args) if a == b"--port"]
    if not any(i + 1 < len(args) and args[i + 1] == str(port).encode() for i in flag):
        return "not ours"
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return "stopped"


def tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * lines))
            data = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


class ProcessLauncher(Launcher):
    """Engines of one kind as local processes of the controller, on 127.0.0.1."""

    def __init__(self, engine: EngineKind) -> None:
        self.engine = engine
        self.name = engine.name
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    async def start(self, spec: LaunchSpec) -> Launched:
        port, side, publish, replay = free_ports("127.0.0.1", 4)
        events = EventPorts(publish, replay)
        cmd = self.engine.command(spec, "127.0.0.1", port, side, events=events)
        proc = spawn(cmd.argv, spec.log_path, cmd.env, nice=cmd.nice)
        self._track(proc)
        return Launched(url=f"http://127.0.0.1:{port}",
                        handle={"proc": proc, "log": spec.log_path, "pid": proc.pid,
                                "side_channel_port": side},
                        kv_events=events.endpoints("127.0.0.1"),
                        kv_peer=self.engine.kv_peer(spec, "127.0.0.1", port, side))

    def _track(self, proc: subprocess.Popen[bytes]) -> None:
        self._procs[proc.pid] = proc

    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        proc: subprocess.Popen[bytes] = launched.handle["proc"]
        await stop_group(proc, grace_s)
        self._procs.pop(proc.pid, None)

    def exit_code(self, launched: Launched) -> int | None:
        proc: subprocess.Popen[bytes] = launched.handle["proc"]
        return proc.poll()

    async def log_tail(self, launched: Launched, lines: int = 100) -> str:
        return tail(launched.handle["log"], lines)

    async def close(self) -> None:
        procs = list(self._procs.values())
        await asyncio.gather(*(stop_group(p, 5.0) for p in procs))
        self._procs.clear()
