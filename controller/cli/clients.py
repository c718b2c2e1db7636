"""Thin command-line clients of the REST API: ``status``, ``scale``, ``tp``, ``kv-mode``,
``route``, through ``pdctl_api``'s client and models."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from controller.cli.args import SubParsers
from pdctl_api.client import DEFAULT_STATE_DIR, DEFAULT_URL, ApiError, PdctlClient, read_token
from pdctl_api.schema import ClusterPublic, PoolPlanPublic, Role

CLI_ACTOR = "pdctl-cli"


class CliError(Exception):
    """A mistake on the command line, or no token to send; nothing was sent."""


def connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--controller", default=os.environ.get("PDCTL_URL", DEFAULT_URL),
                   help=f"controller URL (env PDCTL_URL; default {DEFAULT_URL})")
    p.add_argument("--token", default=os.environ.get("PDCTL_TOKEN"),
                   help="API token (env PDCTL_TOKEN; default: read STATE_DIR/token)")
    p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                   help=f"where to find the token file (default {DEFAULT_STATE_DIR})")


def _client_flags(p: argparse.ArgumentParser) -> None:
    connection_flags(p)
    p.add_argument("--json", action="store_true", help="print the raw JSON answer")


def add_parsers(sub: SubParsers) -> None:
    p = sub.add_parser("status", help="pools, instances and load")
    _client_flags(p)
    p.set_defaults(run=run_status)
    for verb, field, what in (("scale", "size", "size (instances)"),
                              ("tp", "tp", "tensor-parallel size")):
        p = sub.add_parser(verb, help=f"set a pool's {what}",
                           description=f"Set the desired {field} of a pool; the controller "
                                       "converges to it (rolling for TP).")
        p.add_argument("role", choices=[r.value for r in Role])
        p.add_argument("value", type=int, metavar="N")
        _pool_change_flags(p, field)
    p = sub.add_parser(
        "kv-mode", help="set a pool's KV transfer mode (pull or push)",
        description="Set how a pool's engines move the KV cache: pull (vLLM's NixlConnector: "
                    "the decode engine reads the KV once the prefill hop is done) or push "
                    "(NixlPushConnector: the router sends both hops at once and the prefill "
                    "engine writes the KV into the decode engine). The controller replaces "
                    "the pool's instances rolling, draining each old one once its "
                    "replacement is ready. Refused (nothing changed) on the external "
                    "backend, and where the installed vLLM has no NixlPushConnector.")
    p.add_argument("role", choices=[r.value for r in Role])
    p.add_argument("value", choices=["pull", "push"], metavar="pull|push")
    _pool_change_flags(p, "kv_mode")
    p = sub.add_parser("route", help="change routing settings",
                       description="Change routing settings, e.g. "
                                   "`pdctl route disagg_min_prompt_tokens=1024 "
                                   "decode_policy=least_loaded`. No arguments: show them.")
    p.add_argument("settings", nargs="*", metavar="KEY=VALUE")
    _client_flags(p)
    p.set_defaults(run=run_route)


def _pool_change_flags(p: argparse.ArgumentParser, field: str) -> None:
    p.add_argument("--wait", action="store_true", help="wait until the pool converges")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for --wait")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and show what the controller would do; change nothing")
    _client_flags(p)
    p.set_defaults(run=run_pool_change, field=field)


def connect(args: argparse.Namespace) -> PdctlClient:
    token = args.token or read_token(args.state_dir)
    if not token:
        raise CliError(f"no API token: pass --token, set PDCTL_TOKEN, or point --state-dir at "
                       f"the controller's state directory ({args.state_dir / 'token'} not "
                       "readable)")
    return PdctlClient(args.controller, token, actor=CLI_ACTOR, timeout_s=30.0)


def describe(exc: ApiError) -> str:
    if exc.unreachable:
        return f"cannot reach the controller at {exc.url}: {exc.detail}"
    return f"{exc.status}: {exc.detail}"


def _run(fn: Callable[[PdctlClient, argparse.Namespace], int], args: argparse.Namespace
         ) -> int:
    try:
        with connect(args) as client:
            return int(fn(client, args))
    except CliError as exc:
        print(f"pdctl {args.verb}: {exc}", file=sys.stderr)
    except ApiError as exc:
        print(f"pdctl {args.verb}: {describe(exc)}", file=sys.stderr)
    return 1


def _dump(model: BaseModel) -> str:
    return json.dumps(model.model_dump(mode="json"), indent=2)


def _kv_suffix(mode: str | None) -> str:
    """`` KV push`` for a pool or instance in push mode; nothing for pull, the default."""
    return f" KV {mode}" if mode == "push" else ""


def format_status(c: ClusterPublic) -> str:
    hw = c.hardware
    lines = [f"model {c.model.served_name}  backend {c.backend}  "
             f"{hw.accelerator} {hw.used_accelerators}/{hw.total_accelerators} accelerators "
             f"used  link {hw.kv_link}"]
    for role, pool in c.pools.items():
        d, a = pool.desired, pool.actual
        lines.append(f"{role:8} desired {d.size} x TP{d.tp}{_kv_suffix(d.kv_mode)}  "
                     f"ready {a.ready} starting {a.starting} draining {a.draining}  "
                     f"{'converged' if pool.converged else 'converging'}")
    nodes = any(i.node for i in c.instances)  # engines on Ray: say where each runs
    lines.append(f"{'ID':14} {'ROLE':8} {'STATE':9} {'TP':>3} {'INFL':>5} {'RUN':>5} "
                 f"{'WAIT':>5} {'KV%':>5}  " + (f"{'NODE':15} " if nodes else "") + "URL")
    for i in c.instances:
        load = i.load
        where = f"{i.node or '-':15} " if nodes else ""
        lines.append(f"{i.id:14} {i.role:8} {i.state:9} {i.tp:>3} "
                     f"{load.inflight:>5} {load.running:>5.0f} {load.waiting:>5.0f} "
                     f"{100 * load.kv_cache_usage:>5.1f}  {where}{i.url}{_kv_suffix(i.kv_mode)}")
    r = c.routing
    lines.append(f"routing: disaggregate prompts >= {r.disagg_min_prompt_tokens} tokens; "
                 f"prefill {r.prefill_policy}, decode {r.decode_policy}")
    return "\n".join(lines)


def format_plan(plan: PoolPlanPublic) -> str:
    d = plan.desired
    lines = [f"{plan.role}: would set desired {d.size} x TP{d.tp}{_kv_suffix(d.kv_mode)} (dry run, "
             "nothing changed)"]
    if not plan.actions:
        lines.append("  next step: nothing to do")
    for a in plan.actions:
        what = (f"{a.role} at TP{a.tp}{_kv_suffix(a.kv_mode)}" if a.kind == "start"
                else str(a.instance_id))
        lines.append(f"  next step: {a.kind} {what}: {a.reason}")
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    def go(client: PdctlClient, a: argparse.Namespace) -> int:
        c = client.cluster()
        print(_dump(c) if a.json else format_status(c))
        return 0
    return _run(go, args)


def run_pool_change(args: argparse.Namespace) -> int:
    def go(client: PdctlClient, a: argparse.Namespace) -> int:
        change = {a.field: a.value}
        if a.dry_run:
            plan = client.plan_pool(a.role, **change)
            print(_dump(plan) if a.json else format_plan(plan))
            return 0
        pool = client.set_pool(a.role, **change)
        d = pool.desired
        print(f"{a.role}: desired {d.size} x TP{d.tp}{_kv_suffix(d.kv_mode)}")
        if not a.wait:
            return 0
        deadline = time.monotonic() + a.timeout
        while not pool.converged:
            if time.monotonic() > deadline:
                print(f"not converged after {a.timeout:.0f} s", file=sys.stderr)
                return 1
            act = pool.actual
            print(f"  ready {act.ready_at_desired_tp}/{d.size} at TP{d.tp}{_kv_suffix(d.kv_mode)}, "
                  f"starting {act.starting}, draining {act.draining}", flush=True)
            time.sleep(1.0)
            pool = client.pool(a.role)
        print(f"{a.role}: converged")
        return 0
    return _run(go, args)


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CliError(f"expected KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def run_route(args: argparse.Namespace) -> int:
    def go(client: PdctlClient, a: argparse.Namespace) -> int:
        patch = parse_settings(a.settings)
        # The controller validates the patch: its refusal names the field and the reason.
        r = client.set_routing(patch) if patch else client.routing()
        print(_dump(r))
        return 0
    return _run(go, args)
