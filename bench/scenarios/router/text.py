"""The router scenario's report: per case, the latency table against direct, the cost table
(rate ratios, CPU per request), the flow check and the goals; then the routers' command
lines."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable

import orjson

from bench.report import fmt
from bench.scenarios.router.model import ROUTER_PROMPT, ROUTING, CaseResult, RouterResult, Row


def latency_table(c: CaseResult, routers: list[str]) -> list[str]:
    """TTFT and rate per concurrency: direct's, and each router's with what it adds."""
    hdr = f"{'conc':>5} | {'direct p50':>10} {'p99':>7} {'rps':>7}"
    for r in routers:
        hdr += f" | {r + ' p50':>15} {'p99':>7} {'rps':>7} {'+p50':>7} {'+p99':>7}"
    lines = [hdr]
    for conc in c.concurrency:
        d = c.rows[conc]["direct"]
        line = f"{conc:>5} | {fmt(d.p50_ms, '10.2f')} {fmt(d.p99_ms)} {fmt(d.rps, '7.1f')}"
        for r in routers:
            x = c.rows[conc][r]
            line += (f" | {fmt(x.p50_ms, '15.2f')} {fmt(x.p99_ms)} {fmt(x.rps, '7.1f')} "
                     f"{fmt(x.added_p50_ms, '+7.2f')} {fmt(x.added_p99_ms, '+7.2f')}")
        lines.append(line)
    return lines


CellFn = Callable[[dict[str, Row], int], str]  # one concurrency's rows, concurrency -> cell


def _vs_direct(r: str) -> CellFn:
    return lambda row, _: f" {fmt(row[r].rps_vs_direct, '18.2f')}"


def _router_cpu(r: str) -> CellFn:
    return lambda row, _: " | " + (f"{fmt(row[r].cpu_us_per_request, '.0f')} "
                                   f"({fmt(row[r].net_cpu_us_per_request, '.0f')})").rjust(28)


def cost_table(c: CaseResult, routers: list[str]) -> list[str]:
    """Rate ratios and CPU per request per concurrency: a column is its header and a cell
    for each concurrency's rows."""
    cols: list[tuple[str, CellFn]] = [(f" {r + '/direct':>18}", _vs_direct(r)) for r in routers]
    if len(routers) == 2:
        cols.append((f" {'pdctl/vllm-router':>18}",
                     lambda _, conc: f" {fmt(c.ratio_pdctl_vllm_router[conc], '18.2f')}"))
    cols += [(f" | {r + ' CPU us/req (net)':>28}", _router_cpu(r)) for r in routers]
    lines = [f"{'conc':>5} |" + "".join(h for h, _ in cols)
             + f" | {'client CPU us/req':>17} | {'engines CPU us/req':>18} | {'errors':>6}"]
    for conc in c.concurrency:
        row = c.rows[conc]
        client = "/".join(fmt(row[t].client_cpu_us_per_request, ".0f") for t in c.targets)
        engines = "/".join(fmt(row[t].engines_cpu_us_per_request, ".0f") for t in c.targets)
        lines.append(f"{conc:>5} |" + "".join(cell(row, conc) for _, cell in cols)
                     + f" | {client:>17} | {engines:>18} | "
                       f"{sum(row[t].errors for t in c.targets):>6}")
    return lines


def case_report(c: CaseResult, max_tokens: int) -> str:
    routers = [t for t in c.targets if t != "direct"]
    lines = [f"{c.case}: {c.rounds} interleaved round(s) x {c.duration:g} s per cell "
             f"(+{c.warmup:g} s warm-up), {c.engines}, {len(ROUTER_PROMPT)}-char prompt, "
             f"{max_tokens} tokens, streaming, closed loop; {os.cpu_count()} CPUs, load "
             f"average {fmt(c.load_before_after[0], '.1f')} before, "
             f"{fmt(c.load_before_after[1], '.1f')} after",
             "", "TTFT (ms) and requests/s; +p50/+p99: added TTFT against direct",
             *latency_table(c, routers),
             "", "request-rate ratios; router CPU per request (process + children, over all "
             "requests of the cell incl. warm-up; net: less the router's idle CPU); client "
             "and engines CPU per request; errors",
             f"(client and engines CPU: {'/'.join(c.targets)})",
             *cost_table(c, routers)]
    lines.append("idle CPU while other targets ran: " + ", ".join(
        f"{r} {fmt(v, '.2f')}% of a core" for r, v in c.idle_cpu_percent.items()))
    bad = [t for t, f in c.flow.items() if not f.verified]
    lines.append("flow check (one prefill of one token and one KV pull per request): "
                 + (f"FAILED for {', '.join(bad)}" if bad else "verified for every target"))
    lines += ["", "goals", *(g.line() for g in c.goals)]
    return "\n".join(lines)


def router_report(res: RouterResult) -> str:
    out = [f"router cost, pdctl from {res.pdctl_source}, "
           f"{res.options.data_workers} data-plane process(es) (controller.data_workers)"]
    for c in res.cases:
        out += ["", case_report(c, res.options.max_tokens)]
    if res.cases:
        argv = res.cases[-1].argv
        out.append("")
        if "pdctl" in argv:
            out.append("pdctl:       " + shlex.join(argv["pdctl"][1:]) + "  # routing: "
                       + orjson.dumps(ROUTING).decode())
        if "vllm-router" in argv:
            out.append("vllm-router: " + shlex.join(argv["vllm-router"]))
        out.append(f"logs: {', '.join(c.logs for c in res.cases)}")
    return "\n".join(out)
