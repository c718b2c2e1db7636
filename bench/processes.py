"""The processes one run starts: each in a process group of its own with its output in a log
file, remembered with every descendant seen, and all stopped at the end.

``ProcessFleet.start`` runs a program through ``controller.launchers.process.spawn`` (also
``PR_SET_PDEATHSIG``, so a benchmark killed outright takes its processes with it). A
``ProcessFleet`` remembers everything it started and every descendant it has seen (the
engines a controller starts run in process groups of their own), and ``ProcessFleet.stop``
leaves none of them running: SIGTERM to every group (a controller then stops its engines in
order), a grace period, SIGKILL to every group and descendant left, and a report of what was
left. ``wait_until`` polls for readiness while watching that none of them exited;
``interrupt_on_signals`` turns SIGTERM and SIGHUP into Ctrl-C so that a run's ``finally``
blocks stop what it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from controller.launchers.process import signal_group, spawn, tail


class FleetError(RuntimeError):
    """A process exited early, or something did not become ready in time."""


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.popen.pid)

    def running(self) -> bool:
        return self.popen.poll() is None

    def exited(self) -> str | None:
        """None while it runs; else its exit status and the tail of its log."""
        code = self.popen.poll()
        if code is None:
            return None
        return f"{self.name} exited with {code}; the end of {self.log}:\n{tail(self.log, 20)}"


def process_alive(p: psutil.Process) -> bool:
    """Whether ``p`` still runs (a zombie does not)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def spawn_in(cwd: Path | None, argv: list[str], log: Path,
             env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    """``spawn`` started in ``cwd`` (``-m`` puts the working directory first on sys.path)."""
    if cwd is None:
        return spawn(argv, log.resolve(), env)
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return spawn(argv, log.resolve(), env)
    finally:
        os.chdir(old)


@dataclass
class StopReport:
    """What ``ProcessFleet.stop`` found: seconds it took, exit statuses, and what had to be
    killed or was still there after the kill (pid and command line)."""

    seconds: float = 0.0
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    tracked: int = 0  # processes and descendants seen
    left_after_sigterm: int = 0
    left: list[str] = field(default_factory=list)


class ProcessFleet:
    """Every process one run started, with logs in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, Proc] = {}
        self._seen: dict[int, float] = {}  # descendant pid -> create_time

    def __enter__(self) -> ProcessFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None, log: Path | None = None) -> Proc:
        """Start ``argv`` in a process group of its own, output to ``workdir/<name>.log``
        (appended), environment = ours + ``env``."""
        if name in self.procs:
            raise ValueError(f"{name!r} is already started")
        log = log or self.workdir / f"{name}.log"
        proc = self.procs[name] = Proc(name, list(argv), log, spawn_in(cwd, argv, log, env))
        return proc

    def check_alive(self, *names: str) -> None:
        """``FleetError`` when one of ``names`` (default: all) has exited."""
        for p in self.procs.values():
            if names and p.name not in names:
                continue
            why = p.exited()
            if why is not None:
                raise FleetError(why)

    def finish(self, name: str, timeout_s: float) -> int:
        """Wait for one process (a client run to its end) up to ``timeout_s``, then kill its
        group whatever happened (also on Ctrl-C) and forget it; its exit status.
        ``FleetError`` when it ran past the timeout."""
        p = self.procs[name]
        try:
            p.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise FleetError(f"{name} ran past {timeout_s:.0f} s; see {p.log}") from None
        finally:
            signal_group(p.popen, signal.SIGKILL)  # its workers too
            p.popen.wait()
            del self.procs[name]
        return p.popen.returncode

    def note_descendants(self) -> list[psutil.Process]:
        """Remember every live descendant (to stop them even after their parent is gone)."""
        found: list[psutil.Process] = []
        for p in self.procs.values():
            with contextlib.suppress(psutil.Error):
                for ch in psutil.Process(p.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        self._seen.setdefault(ch.pid, ch.create_time())
                        found.append(ch)
        return found

    def descendants(self, match: str = "") -> list[int]:
        """Pids of live descendants seen so far (their command line containing ``match``)."""
        self.note_descendants()
        out = []
        for pid, created in self._seen.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if abs(p.create_time() - created) < 0.01 and process_alive(p) and (
                        not match or match in " ".join(p.cmdline())):
                    out.append(pid)
        return out

    def pids(self) -> set[int]:
        """Every live process started here and every descendant seen."""
        return {p.pid for p in self.procs.values() if p.running()} | set(self.descendants())

    def stop(self, grace_s: float = 30.0, first: tuple[str, ...] = ()) -> StopReport:
        """Stop everything: ``first`` (e.g. a controller, so it stops its engines itself)
        then the rest get SIGTERM by process group; after ``grace_s`` (or as soon as all are
        gone) SIGKILL to every group and descendant left."""
        report = StopReport()
        t0 = time.monotonic()
        self.note_descendants()
        report.tracked = len(self.procs) + len(self._seen)
        for name in first:
            if name in self.procs:
                signal_group(self.procs[name].popen, signal.SIGTERM)
        for p in self.procs.values():
            signal_group(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (
                any(p.running() for p in self.procs.values()) or self.descendants()):
            time.sleep(0.1)
        left = self.descendants()
        report.left_after_sigterm = len(left) + sum(p.running() for p in self.procs.values())
        self._kill(left)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)
            report.exit_codes[p.name] = p.popen.returncode
        time.sleep(0.1)
        for pid in self.descendants():
            with contextlib.suppress(psutil.Error):
                report.left.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:160]}")
        report.seconds = round(time.monotonic() - t0, 1)
        self.procs.clear()
        self._seen.clear()
        return report

    def _kill(self, left: list[int]) -> None:
        """SIGKILL to every group started here, every group of a descendant ``left`` (never
        our own), and each of those descendants."""
        for p in self.procs.values():
            signal_group(p.popen, signal.SIGKILL)
        ours = os.getpgid(0)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group != ours:
                    os.killpg(group, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def wait_until(what: str, ok: Callable[[], bool], timeout_s: float,
               fleet: ProcessFleet | None = None, interval_s: float = 0.2,
               progress: Callable[[float], str] | None = None,
               progress_every_s: float = 20.0) -> float:
    """Poll ``ok`` until it is true; seconds it took. Exceptions from ``ok`` count as not
    yet. ``FleetError`` after ``timeout_s``, or as soon as a process of ``fleet`` exits.
    ``progress(elapsed)`` is printed every ``progress_every_s``."""
    t0 = time.monotonic()
    last = t0
    while True:
        if fleet is not None:
            fleet.check_alive()
        try:
            if ok():
                return time.monotonic() - t0
        except (OSError, ValueError, KeyError, TypeError, httpx.HTTPError):
            pass
        now = time.monotonic()
        if now - t0 > timeout_s:
            raise FleetError(f"{what} not ready after {timeout_s:.0f} s")
        if progress is not None and now - last >= progress_every_s:
            print(f"  {progress(now - t0)}", flush=True)
            last = now
        time.sleep(interval_s)


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``KeyboardInterrupt`` (as Ctrl-C does) while inside, so that
    a benchmark's ``finally`` stops what it started; SIGINT is restored to its default."""
    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
