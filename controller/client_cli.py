"""Thin command-line clients of the REST API: ``status``, ``scale``, ``tp``, ``route``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

SubParsers = Any


class ApiError(Exception):
    pass


def _client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--controller", default=os.environ.get("PDCTL_URL", "http://127.0.0.1:8080"),
                   help="controller URL (env PDCTL_URL; default http://127.0.0.1:8080)")
    p.add_argument("--token", default=os.environ.get("PDCTL_TOKEN"),
                   help="API token (env PDCTL_TOKEN; default: read STATE_DIR/token)")
    p.add_argument("--state-dir", type=Path, default=Path(".pdctl"),
                   help="where to find the token file (default .pdctl)")
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
        p.add_argument("role", choices=["prefill", "decode"])
        p.add_argument("value", type=int, metavar="N")
        p.add_argument("--wait", action="store_true", help="wait until the pool converges")
        p.add_argument("--timeout", type=float, default=600.0, help="seconds for --wait")
        _client_flags(p)
        p.set_defaults(run=run_pool_change, field=field)
    p = sub.add_parser("route", help="change routing settings",
                       description="Change routing settings, e.g. "
                                   "`pdctl route disagg_min_prompt_tokens=1024 "
                                   "decode_policy=least_loaded`. No arguments: show them.")
    p.add_argument("settings", nargs="*", metavar="KEY=VALUE")
    _client_flags(p)
    p.set_defaults(run=run_route)


class Api:
    def __init__(self, args: argparse.Namespace) -> None:
        token = args.token
        if not token:
            path = args.state_dir / "token"
            try:
                token = path.read_text().strip()
            except OSError:
                raise ApiError(f"no API token: pass --token, set PDCTL_TOKEN, or point "
                               f"--state-dir at the controller's state directory ({path} "
                               "not readable)") from None
        self.base = args.controller.rstrip("/")
        self.http = httpx.Client(headers={"Authorization": f"Bearer {token}",
                                          "X-Pdctl-Actor": "pdctl-cli"}, timeout=30.0)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            r = self.http.request(method, f"{self.base}/api/v1{path}", json=body)
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the controller at {self.base}: {exc}") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise ApiError(f"{r.status_code}: {detail}")
        return r.json()


def _run(fn: Any, args: argparse.Namespace) -> int:
    try:
        return int(fn(Api(args), args))
    except ApiError as exc:
        print(f"pdctl {args.verb}: {exc}", file=sys.stderr)
        return 1


def format_status(c: dict[str, Any]) -> str:
    lines = [f"model {c['model']['served_name']}  backend {c['backend']}  "
             f"{c['hardware']['accelerator']} {c['hardware']['used_accelerators']}/"
             f"{c['hardware']['total_accelerators']} accelerators used  "
             f"link {c['hardware']['kv_link']}"]
    for role, pool in c["pools"].items():
        d, a = pool["desired"], pool["actual"]
        lines.append(f"{role:8} desired {d['size']} x TP{d['tp']}  ready {a['ready']} "
                     f"starting {a['starting']} draining {a['draining']}  "
                     f"{'converged' if pool['converged'] else 'converging'}")
    lines.append(f"{'ID':14} {'ROLE':8} {'STATE':9} {'TP':>3} {'INFL':>5} {'RUN':>5} "
                 f"{'WAIT':>5} {'KV%':>5}  URL")
    for i in c["instances"]:
        load = i["load"]
        lines.append(f"{i['id']:14} {i['role']:8} {i['state']:9} {i['tp']:>3} "
                     f"{load['inflight']:>5} {load['running']:>5.0f} {load['waiting']:>5.0f} "
                     f"{100 * load['kv_cache_usage']:>5.1f}  {i['url']}")
    r = c["routing"]
    lines.append(f"routing: disaggregate prompts >= {r['disagg_min_prompt_tokens']} tokens; "
                 f"prefill {r['prefill_policy']}, decode {r['decode_policy']}")
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    def go(api: Api, a: argparse.Namespace) -> int:
        c = api.call("GET", "/cluster")
        print(json.dumps(c, indent=2) if a.json else format_status(c))
        return 0
    return _run(go, args)


def run_pool_change(args: argparse.Namespace) -> int:
    def go(api: Api, a: argparse.Namespace) -> int:
        pool = api.call("PATCH", f"/pools/{a.role}", {a.field: a.value})
        d = pool["desired"]
        print(f"{a.role}: desired {d['size']} x TP{d['tp']}")
        if not a.wait:
            return 0
        deadline = time.monotonic() + a.timeout
        while not pool["converged"]:
            if time.monotonic() > deadline:
                print(f"not converged after {a.timeout:.0f} s", file=sys.stderr)
                return 1
            act = pool["actual"]
            print(f"  ready {act['ready_at_desired_tp']}/{d['size']} at TP{d['tp']}, "
                  f"starting {act['starting']}, draining {act['draining']}", flush=True)
            time.sleep(1.0)
            pool = api.call("GET", f"/pools/{a.role}")
        print(f"{a.role}: converged")
        return 0
    return _run(go, args)


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ApiError(f"expected KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def run_route(args: argparse.Namespace) -> int:
    def go(api: Api, a: argparse.Namespace) -> int:
        patch = parse_settings(a.settings)
        r = api.call("PATCH", "/routing", patch) if patch else api.call("GET", "/routing")
        print(json.dumps(r, indent=2))
        return 0
    return _run(go, args)
