"""``pdctl fault SCENARIO``: rehearse one fault against a running fleet (the simulated lab, the
real CPU lab, a compose lab from inside its controller container) under a load of known
prompts, and judge what that load's clients saw (``controller.faults.outcome``).

Kills and stalls signal engine processes, and ``fill-disk`` fills the state directory's
disk, so it runs on the host of the engines the controller started (local launcher);
``restart-controller`` runs the operator's own restart command. The load goes through the
data plane like any client's. ``--reference`` first asks every prompt once colocated at
temperature 0 (the routing threshold is raised for that and restored: two audited routing
changes), so that each answer under the fault can be compared with it token for token.
Exit status: 0 every check passed, 1 one failed, 2 the fault could not be injected or the
controller not reached.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from controller.cli.args import SubParsers, count_arg, positive_arg
from controller.cli.clients import CliError, connect, connection_flags, describe
from controller.faults import inject
from controller.faults.load import DataClient, fault_prompts, under_load
from controller.faults.outcome import (
    EXPECTED_EVENTS,
    ClientOutcome,
    FaultCheck,
    Report,
    full_disk_told,
    nothing_held,
    recorded,
    recovered,
    render_report,
    same_answers,
    served,
    told,
)
from pdctl_api.client import ApiError, PdctlClient

COLOCATED = 1_000_000  # a routing threshold no prompt reaches
TOLD_S = 30.0  # how long the fault's event may take to reach the audit log


def add_fault_parser(sub: SubParsers) -> None:
    width = max(map(len, inject.FAULT_SCENARIOS))
    scenarios = "\n".join(textwrap.fill(v, 79, initial_indent=f"  {k:{width}s}  ",
                                         subsequent_indent=" " * (width + 4))
                           for k, v in inject.FAULT_SCENARIOS.items())
    p = sub.add_parser(
        "fault", help="rehearse a fault under load and judge what clients saw",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Inject one fault into the running fleet while sending it a load of distinct "
            "prompts long enough to be disaggregated, then check: every request completed or "
            "got a clear error, none hung, every answered request is in the controller's "
            "records, nothing is held on an engine once the KV lease has run out, the fault "
            "is in the audit log, and the fleet can serve again. Run it on a lab or an idle "
            "fleet (other traffic keeps engines busy) on the host where the controller runs "
            "its engines.", 79),
        epilog=f"scenarios:\n{scenarios}\n\nexit status: 0 passed, 1 a check failed, 2 not "
               "injected\n(no ready instance, engines elsewhere, no controller)")
    p.add_argument("scenario", choices=list(inject.FAULT_SCENARIOS), metavar="SCENARIO",
                   help=", ".join(inject.FAULT_SCENARIOS))
    p.add_argument("--requests", type=count_arg, default=24, help="prompts sent (default 24)")
    p.add_argument("--concurrency", type=count_arg, default=4,
                   help="requests in flight at once (default 4)")
    p.add_argument("--max-tokens", type=count_arg, default=8,
                   help="tokens per answer (default 8)")
    p.add_argument("--reference", action="store_true",
                   help="compare every answer with its prompt's colocated temperature-0 "
                        "answer, asked first (changes the routing threshold for that, "
                        "then restores it)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="ask for every answer's full --max-tokens (vLLM's ignore_eos: a "
                        "lab model with random weights may end any answer at once)")
    p.add_argument("--stall-s", type=positive_arg, default=None,
                   help="stall-prefill: seconds stopped (default: the KV lease + 2)")
    p.add_argument("--hold-s", type=positive_arg, default=10.0,
                   help="fill-disk: seconds the disk stays full (default 10)")
    p.add_argument("--max-fill-mb", type=positive_arg, default=1024.0,
                   help="fill-disk: the largest file system it fills, MiB (default 1024): "
                        "it refuses to fill the machine's own disk")
    p.add_argument("--restart-cmd", default=None,
                   help="restart-controller: the shell command that restarts the controller "
                        "(e.g. 'systemctl restart pdctl', 'docker compose -f "
                        "docker/compose.cpu.yml restart controller')")
    p.add_argument("--recover-timeout", type=positive_arg, default=900.0,
                   help="seconds to wait for the fleet to serve again (default 900: a real "
                        "engine's restart takes minutes on a small CPU machine)")
    p.add_argument("--api-key", default=os.environ.get("PDCTL_API_KEY"),
                   help="the data plane's API key, where it has one (env PDCTL_API_KEY)")
    connection_flags(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run_fault)


def run_fault(args: argparse.Namespace) -> int:
    try:
        with connect(args) as client:
            report = rehearse_fault(client, args, progress=lambda m: print(m, file=sys.stderr,
                                                                     flush=True))
    except (CliError, inject.FaultRefused) as exc:
        print(f"pdctl fault: {exc}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(f"pdctl fault: {describe(exc)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"ok": report.ok, **asdict(report)}, indent=2))
    else:
        print(render_report(report))
    return 0 if report.ok else 1


def rehearse_fault(client: PdctlClient, args: argparse.Namespace,
                   progress: Callable[[str], None]) -> Report:
    cluster = client.cluster()
    routing = cluster.routing
    role = inject.ROLE[args.scenario]
    victim = None if role == "controller" or args.scenario == "tp-change" else inject.victim(
        [i.model_dump() for i in cluster.instances], role)
    target = role if victim is None else str(victim["id"])
    if args.scenario == "fill-disk":
        target = str(_state_dir(args.state_dir))
    if args.scenario == "restart-controller" and not args.restart_cmd:
        raise inject.FaultRefused("restart-controller needs --restart-cmd: the command that "
                                  "restarts this controller where you run it")
    extra: list[FaultCheck] = []
    back: list[float] = []  # restart-controller: when it answered again
    lease = cluster.kv_lease_s or 30.0
    asked = fault_prompts(args.requests, routing.disagg_min_prompt_tokens, os.urandom(3).hex())
    data = DataClient(client.base_url, cluster.model.served_name, args.max_tokens,
                      routing.request_timeout_s + 30.0, args.api_key, args.ignore_eos)
    try:
        reference = _reference(client, data, asked, routing.disagg_min_prompt_tokens,
                               progress) if args.reference else None
        progress(f"pdctl fault: {args.scenario} on {target} under {len(asked)} requests, "
                 f"{args.concurrency} at a time")

        def fault() -> str:
            if args.scenario == "fill-disk":
                return _fill_disk(client, Path(target), args, extra)
            if args.scenario == "restart-controller":
                return _restart_controller(client, args.restart_cmd, args.recover_timeout,
                                           back)
            if victim is None:
                return _tp_change(client, role, args.recover_timeout)
            if args.scenario == "stall-prefill":
                return inject.stall(victim, args.stall_s or lease + 2)
            return inject.kill(victim)
        outcomes, started, detail = under_load(data, asked, args.concurrency, fault)
    finally:
        data.close()
    report = Report(args.scenario, target, detail, started)
    progress(f"pdctl fault: {detail}; judging what the clients saw")
    report.checks.append(served(outcomes, refusals_ok=args.scenario == "restart-controller"))
    if reference is not None:
        report.checks.append(same_answers(outcomes, reference))
    # A restarted controller keeps no records of the requests its previous run served.
    kept = [o for o in outcomes if not back or o.sent_at >= back[0]]
    report.checks.append(recorded(kept, *_records(client, kept)))
    report.checks.append(_wait_ready(client, started, args.recover_timeout))
    report.checks.append(nothing_held(_wait_idle(client, lease + 15.0)))
    if args.scenario in EXPECTED_EVENTS:
        report.checks.append(_told(client, EXPECTED_EVENTS[args.scenario], target, started))
    report.checks.extend(extra)
    return report


def _told(client: PdctlClient, expected: tuple[str, ...], target: str, started: float,
          timeout_s: float = TOLD_S) -> FaultCheck:
    """One of ``expected`` events about ``target`` in the audit log, waited for: the fleet
    writes an engine off at its next health checks (the requests that failed on it only
    bring the first check forward), which can come after the load's last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        kinds = [e.kind for e in client.events(limit=1000, since=started - 1)
                 if e.target == target]
        if any(k in expected for k in kinds) or time.monotonic() > deadline:
            return told(kinds, expected, target)
        time.sleep(0.5)


def _restart_controller(client: PdctlClient, cmd: str, timeout_s: float,
                        back: list[float]) -> str:
    """The operator's restart command run, then ``/healthz`` waited for; ``back`` gets the
    unix time the controller answered again."""
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, shell=True, capture_output=True, text=True,  # noqa: S602
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"`{cmd}` still running after {timeout_s:g} s"
    ran = f"`{cmd}` exited {done.returncode} after {time.monotonic() - t0:.1f} s"
    if done.returncode != 0:
        return f"{ran}: {(done.stderr or done.stdout).strip()[-300:]}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ApiError):
            client.health()
            back.append(time.time())
            return f"{ran}; the controller answered again {time.monotonic() - t0:.1f} s " \
                   "after the restart began"
        time.sleep(0.2)
    return f"{ran}; the controller did not answer within {timeout_s:g} s"


def _state_dir(path: Path) -> Path:
    if not (path / "state.db").is_file():
        raise inject.FaultRefused(f"{path} is not the controller's state directory (no "
                                  "state.db): give it with --state-dir")
    return path


def _same_routing_write(client: PdctlClient) -> str | None:
    """A routing change to the value it has (an audited write, nothing changed): None when
    it was taken, else the refusal."""
    threshold = client.routing().disagg_min_prompt_tokens
    try:
        client.set_routing({"disagg_min_prompt_tokens": threshold})
    except ApiError as exc:
        if exc.status is None:
            raise
        return f"{exc.status}: {exc.detail}"
    return None


def _fill_disk(client: PdctlClient, state_dir: Path, args: argparse.Namespace,
               extra: list[FaultCheck]) -> str:
    """The state directory's file system filled for ``--hold-s``, an operator's change
    tried meanwhile and after, and what ``/cluster`` said."""
    ballast = inject.fill_filesystem(state_dir, int(args.max_fill_mb * 2**20))
    try:
        t0 = time.monotonic()
        size = ballast.stat().st_size
        refused = _same_routing_write(client)
        problem = client.cluster().state_problem
        time.sleep(max(0.0, args.hold_s - (time.monotonic() - t0)))
    finally:
        ballast.unlink(missing_ok=True)
    extra.append(full_disk_told(refused, problem, _same_routing_write(client)))
    return f"{size / 2**20:.1f} MiB written to {ballast} and held {args.hold_s:g} s, then removed"


def _reference(client: PdctlClient, data: DataClient, asked: list[str], threshold: int,
               progress: Callable[[str], None]) -> dict[int, str]:
    progress(f"pdctl fault: the reference: {len(asked)} prompts colocated at temperature 0")
    client.set_routing({"disagg_min_prompt_tokens": COLOCATED})
    try:
        out = {}
        for k, p in enumerate(asked):
            o = data.ask(f"fault-ref-{os.urandom(4).hex()}-{k}", k, p, False)
            if o.text is None:
                raise CliError(f"the reference for prompt {k} failed: {o.error}")
            out[k] = o.text
        return out
    finally:
        client.set_routing({"disagg_min_prompt_tokens": threshold})


def _tp_change(client: PdctlClient, role: str, timeout_s: float) -> str:
    """The pool's TP changed (1 <-> 2), and the rolling change waited for."""
    tp = client.pool(role).desired.tp
    t0 = time.monotonic()
    pool = client.set_pool(role, tp=inject.other_tp(tp))
    while not pool.converged and time.monotonic() - t0 < timeout_s:
        time.sleep(1.0)
        pool = client.pool(role)
    took = f"converged in {time.monotonic() - t0:.0f} s" if pool.converged else (
        f"NOT converged after {timeout_s:g} s")
    return f"TP {tp} -> {inject.other_tp(tp)}, {took}"


def _records(client: PdctlClient, outcomes: list[ClientOutcome], wait_s: float = 10.0
             ) -> tuple[list[str], Counter[str]]:
    """The answered requests the controller has no record of (``wait_s`` for the last
    records to be written), and the paths the others were served on."""
    missing = [o.rid for o in outcomes if o.answered]
    paths: Counter[str] = Counter()
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for rid in missing:
            try:
                paths[str(client.request(rid).path)] += 1
            except ApiError as exc:
                if exc.status != 404:
                    raise
                left.append(rid)
        missing = left
        if not missing or time.monotonic() > deadline:
            return missing, paths
        time.sleep(0.5)


def _wait_ready(client: PdctlClient, started: float, timeout_s: float) -> FaultCheck:
    """``/readyz`` answering 200 within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    why = ""
    while True:
        try:
            r = httpx.get(f"{client.base_url}/readyz", timeout=5.0)
            if r.status_code == 200:
                return recovered(True, time.time() - started, "")
            why = str(r.json().get("reason") or r.status_code)
        except (httpx.HTTPError, ValueError) as exc:
            why = f"/readyz: {exc}"
        if time.monotonic() > deadline:
            return recovered(False, time.time() - started,
                             f"not ready {timeout_s:g} s after the load: {why}")
        time.sleep(1.0)


def _held(instances: list[Any]) -> dict[str, str]:
    out = {}
    for i in instances:
        if i.state != "ready":
            continue
        what = []
        if i.load.kv_handles_out:
            what.append(f"{i.load.kv_handles_out} KV handles out")
        if i.load.kv_cache_usage > 0:
            what.append(f"KV cache use {i.load.kv_cache_usage:.1%}")
        if what:
            out[i.id] = ", ".join(what)
    return out


def _wait_idle(client: PdctlClient, timeout_s: float) -> dict[str, str]:
    """What the ready instances still hold once ``timeout_s`` (the lease and a margin) has
    passed; returns early when nothing is."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = _held(client.instances())
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(1.0)
