"""Processes of a benchmark or an integration test: start, watch, wait for, stop.

The one place that starts a ``pdctl controller`` (``start_controller`` -> ``ControllerProc``),
simulated and instant engines, a peer router or any other program, each in its own process
group with its output in a log file (``controller.launchers.process.spawn``: also
``PR_SET_PDEATHSIG``, so a benchmark killed outright takes its processes with it). A
``Fleet`` remembers everything it started and every descendant it has seen (the engines a
controller starts run in process groups of their own), and ``Fleet.stop`` leaves none of
them running: SIGTERM to every group (a controller then stops its engines in order), a
grace period, SIGKILL to every group and descendant left, and a report of what was left.

Both the benchmarks (``bench.router``, ``bench.lab``, ``bench.scale``) and
``tests/integration/harness.py`` use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from controller.launchers.process import free_port, spawn, tail

__all__ = ["ControllerProc", "Fleet", "FleetError", "Proc", "StopReport", "controller_package",
           "free_port", "healthy", "instant_engine_argv", "interrupt_on_signals",
           "sim_engine_argv", "source_of", "start_controller", "tail", "wait_until"]


class FleetError(RuntimeError):
    """A process exited early, or something did not become ready in time."""


# ---- one process ------------------------------------------------------------------------

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


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    if pgid == os.getpgid(0):
        return  # never our own group
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class StopReport:
    """What ``Fleet.stop`` found: seconds it took, exit statuses, and what had to be killed
    or was still there after the kill (pid and command line)."""

    seconds: float = 0.0
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    tracked: int = 0  # processes and descendants seen
    left_after_sigterm: int = 0
    left: list[str] = field(default_factory=list)


# ---- a fleet of them ---------------------------------------------------------------------

class Fleet:
    """Every process one run started, with logs in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, Proc] = {}
        self._seen: dict[int, float] = {}  # descendant pid -> create_time

    def __enter__(self) -> Fleet:
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
        if cwd is None:
            popen = spawn(argv, log.resolve(), env)
        else:
            old = Path.cwd()
            os.chdir(cwd)
            try:
                popen = spawn(argv, log.resolve(), env)
            finally:
                os.chdir(old)
        proc = self.procs[name] = Proc(name, list(argv), log, popen)
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
            _signal_group(p.pid, signal.SIGKILL)  # its workers too
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
                if abs(p.create_time() - created) < 0.01 and _alive(p) and (
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
                _signal_group(self.procs[name].pid, signal.SIGTERM)
        for p in self.procs.values():
            _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (
                any(p.running() for p in self.procs.values()) or self.descendants()):
            time.sleep(0.1)
        left = self.descendants()
        report.left_after_sigterm = len(left) + sum(p.running() for p in self.procs.values())
        groups = {p.pid for p in self.procs.values()}
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                groups.add(os.getpgid(pid))
        for g in groups:
            _signal_group(g, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
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


# ---- waiting ---------------------------------------------------------------------------

def wait_until(what: str, ok: Callable[[], bool], timeout_s: float,
               fleet: Fleet | None = None, interval_s: float = 0.2,
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


def healthy(url: str, path: str = "/health", timeout_s: float = 2.0) -> bool:
    """Whether ``url + path`` answers 200."""
    try:
        return httpx.get(url + path, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


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


# ---- engines -----------------------------------------------------------------------------

def sim_engine_argv(port: int, role: str, model: str, hardware: str = "h100-sxm", tp: int = 1,
                    time_scale: float = 1.0) -> list[str]:
    """``python -m controller.engines.sim`` for one engine."""
    return [sys.executable, "-m", "controller.engines.sim", "--port", str(port), "--role", role,
            "--model", model, "--hardware", hardware, "--tp", str(tp),
            "--time-scale", str(time_scale)]


def instant_engine_argv(prefill_port: int, decode_port: int, model: str) -> list[str]:
    """``python -m bench.instant_engine``: a prefill and a decode port that answer at once."""
    return [sys.executable, "-m", "bench.instant_engine", "--prefill-port", str(prefill_port),
            "--decode-port", str(decode_port), "--model", model]


# ---- the controller ----------------------------------------------------------------------

@dataclass
class ControllerProc:
    """A running ``pdctl controller``: its process, URL, state directory and log, and calls
    to its API with its token."""

    proc: subprocess.Popen[bytes]
    url: str
    state_dir: Path
    log_path: Path
    argv: list[str] = field(default_factory=list)

    @property
    def token(self) -> str:
        return (self.state_dir / "token").read_text().strip()

    def api(self, method: str, path: str, body: Any = None, token: str | None = "default",
            timeout_s: float = 30.0, params: dict[str, Any] | None = None) -> httpx.Response:
        """``/api/v1`` + ``path``; ``token``: "default" (the controller's), None, or another."""
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {self.token if token == 'default' else token}"
        return httpx.request(method, f"{self.url}/api/v1{path}", json=body, headers=headers,
                             params=params, timeout=timeout_s)

    def get(self, path: str, **params: Any) -> Any:
        r = self.api("GET", path, params=params or None)
        r.raise_for_status()
        return r.json()

    def healthz(self, timeout_s: float = 2.0) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/healthz", timeout=timeout_s)
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def ready(self) -> dict[str, int]:
        """Ready instances per role, from ``/healthz``."""
        return dict(self.healthz().get("ready", {}))

    def metrics_text(self, timeout_s: float = 30.0) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=timeout_s).text

    def wait(self, pred: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n"
                             f"{json.dumps(self.get('/cluster')['pools'], indent=1)}")

    def converged(self) -> bool:
        pools = self.get("/cluster")["pools"]
        return all(p["converged"] for p in pools.values())

    def wait_converged(self, timeout: float = 60.0) -> None:
        self.wait(self.converged, timeout, "pools to converge")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM (the controller stops its engines), SIGKILL to its group after
        ``grace_s``; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _signal_group(self.proc.pid, signal.SIGKILL)  # anything left in its group
        return self.proc.returncode


def source_of(pdctl_root: Path | None) -> str:
    """Where the controller's code comes from: this checkout, or ``pdctl_root``, with its
    commit (and whether ``controller/`` there differs from that commit)."""
    root = (pdctl_root or Path(__file__).resolve().parents[1]).resolve()
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                            "controller"], capture_output=True, text=True).stdout.strip()
    what = "this checkout" if pdctl_root is None else str(root)
    changes = " + uncommitted changes in controller/" if dirty else ""
    return f"{what} (commit {head or '?'}{changes})"


def controller_package(pdctl_root: Path | None) -> Path:
    """Where ``import controller`` resolves for a controller started with ``pdctl_root`` (as
    ``start_controller`` starts it): a check that another tree really is the one that runs."""
    env = {**os.environ, "PYTHONPATH": str(pdctl_root)} if pdctl_root else None
    out = subprocess.run([sys.executable, "-c", "import controller; print(controller.__file__)"],
                         cwd=pdctl_root, env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()).parent


def start_controller(workdir: Path, config: dict[str, Any], *, name: str = "controller",
                     fleet: Fleet | None = None, pdctl_root: Path | None = None,
                     log_level: str | None = None, wait: str = "up", timeout_s: float = 30.0,
                     env: dict[str, str] | None = None, config_file: str | None = None
                     ) -> ControllerProc:
    """Write ``config`` to ``workdir/<name>.yaml`` (or ``workdir/<config_file>``) and run
    ``pdctl controller`` on it.

    ``config["controller"]`` gets a free ``port`` and ``state_dir`` = ``workdir/state``
    unless it names them. ``pdctl_root``: run the controller's code from that source tree
    (this interpreter, ``PYTHONPATH`` = it, started in it) instead of this checkout.
    ``wait``: "up" (``/healthz`` answers), "converged" (also every pool converged) or "none".
    With ``fleet`` the process is one of the fleet's (stopped with it); its log is
    ``workdir/<name>.log``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    ctl_cfg = dict(config.get("controller") or {})
    ctl_cfg.setdefault("port", free_port())
    ctl_cfg.setdefault("state_dir", str(workdir / "state"))
    config = {**config, "controller": ctl_cfg}
    cfg_path = workdir / (config_file or f"{name}.yaml")
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [sys.executable, "-m", "controller.cli", "controller", "--config", str(cfg_path)]
    if log_level:
        argv += ["--log-level", log_level]
    env = {"PYTHONUNBUFFERED": "1", **(env or {})}
    cwd = None
    if pdctl_root is not None:
        env["PYTHONPATH"] = str(pdctl_root.resolve())
        cwd = pdctl_root.resolve()  # ``-m`` puts the working directory first on sys.path
    log_path = workdir / f"{name}.log"
    if fleet is not None:
        popen = fleet.start(name, argv, env, cwd, log=log_path).popen
    else:
        with contextlib.ExitStack() as stack:
            if cwd is not None:
                old = Path.cwd()
                os.chdir(cwd)
                stack.callback(os.chdir, old)
            popen = spawn(argv, log_path.resolve(), env)
    ctl = ControllerProc(popen, f"http://127.0.0.1:{ctl_cfg['port']}",
                         Path(ctl_cfg["state_dir"]), log_path, argv)
    if wait == "none":
        return ctl
    deadline = time.monotonic() + timeout_s
    while True:
        if popen.poll() is not None:
            raise FleetError(f"controller exited {popen.returncode}:\n{tail(log_path, 40)}")
        try:
            if httpx.get(f"{ctl.url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            ctl.stop()
            raise FleetError(f"controller did not come up in {timeout_s:.0f} s:\n"
                             f"{tail(log_path, 40)}")
        time.sleep(0.1)
    if wait == "converged":
        try:
            ctl.wait_converged()
        except BaseException:
            ctl.stop()  # a controller whose pools never converged is not left running
            raise
    return ctl
