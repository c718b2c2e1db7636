"""The router scenario's processes and requests: one case's engines, pdctl and vllm-router
started; a request through each target (the client's own two hops, or one router); the
engines' counters; the flow check that every request made one prefill and one KV pull."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from bench import prom
from bench.fleet import (
    SIM_HARDWARE,
    SIM_MODEL_8B,
    free_port,
    healthy,
    instant_engine_argv,
    sim_engine_argv,
    start_controller,
)
from bench.loadgen import Client, RequestFn, closed_loop, run
from bench.processes import ProcessFleet, wait_until
from bench.scenarios.router.model import ROUTING, EngineCounters, FlowCheck, RouterOptions

# NixlConnector's prefill-hop parameters, as vLLM's own proxy (and pdctl) send them.
PREFILL_KV = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}


def read_engine_counters(p_url: str, d_url: str) -> EngineCounters:
    p = prom.parse(httpx.get(f"{p_url}/metrics", timeout=10).text)
    d = prom.parse(httpx.get(f"{d_url}/metrics", timeout=10).text)
    return EngineCounters(
        p.sum("vllm:request_success_total"), p.sum("vllm:generation_tokens_total"),
        d.sum("vllm:request_success_total"), d.sum("vllm:nixl_xfer_time_seconds_count"),
        d.sum("vllm:prompt_tokens_by_source_total", source="external_kv_transfer"),
        p.sum("vllm:nixl_num_notifications_after_expiry_total"))


@dataclass(frozen=True)
class Urls:
    prefill: str
    decode: str
    pdctl: str
    router: str


def request_fn(target: str, urls: Urls, body: dict[str, Any]) -> RequestFn:
    """``fn(client) -> TTFT seconds`` for one target."""
    if target == "direct":
        p_comp, d_comp = f"{urls.prefill}/v1/completions", f"{urls.decode}/v1/completions"
        pbody = {**body, "stream": False, "max_tokens": 1, "kv_transfer_params": PREFILL_KV}
        pbody.pop("stream_options", None)
        ppayload = orjson.dumps(pbody)

        async def direct(c: Client) -> float:
            t0 = time.perf_counter()
            answer = await c.post_json(p_comp, ppayload)
            kv = answer["kv_transfer_params"]
            # A body carrying a KV handle goes out once (no re-send on a fresh connection).
            return await c.request(d_comp, orjson.dumps({**body, "kv_transfer_params": kv}),
                                   stream=True, t0=t0, resend=False)
        return direct
    url = {"pdctl": urls.pdctl, "vllm-router": urls.router}[target] + "/v1/completions"
    payload = orjson.dumps(body)

    async def routed(c: Client) -> float:
        return await c.request(url, payload, stream=True)
    return routed


def flow_check(targets: list[str], urls: Urls, body: dict[str, Any],
               n: int = 5) -> dict[str, FlowCheck]:
    """Send ``n`` sequential requests through each target and read what the engines did."""
    out: dict[str, FlowCheck] = {}
    for target in targets:
        before = read_engine_counters(urls.prefill, urls.decode)
        res = run(closed_loop(request_fn(target, urls, body), 1, 60.0, max_requests=n))
        d = read_engine_counters(urls.prefill, urls.decode) - before
        ok = (res.total_done == n and res.errors == 0 and d.prefill_requests == n
              and d.prefill_tokens == n and d.kv_pulls == n and d.decode_requests == n
              and d.kv_tokens > 0 and d.stale_reads == 0)
        out[target] = FlowCheck(n, res.total_done, res.errors, res.error_samples, d, ok)
    return out


def print_flow(case: str, flow: dict[str, FlowCheck]) -> None:
    for target, f in flow.items():
        c = f.counters
        print(f"  {target:12} {'OK ' if f.verified else 'BAD'} ok={f.ok} errors={f.errors}"
              f" prefill requests +{c.prefill_requests:.0f} (tokens "
              f"+{c.prefill_tokens:.0f}), decode requests +{c.decode_requests:.0f}, KV "
              f"pulls +{c.kv_pulls:.0f} ({c.kv_tokens / f.requests:.0f} prompt tokens "
              f"each), stale reads +{c.stale_reads:.0f}", flush=True)
        for e in f.error_samples:
            print(f"    {e}", flush=True)
    if not all(f.verified for f in flow.values()):
        print(f"[{case}] flow check FAILED: see above; measuring anyway", flush=True)


def start_engines(case: str, opts: RouterOptions, fleet: ProcessFleet, pp: int,
                  dp: int) -> str:
    """The case's engine pair, started; what they are."""
    if case == "router-bound":
        fleet.start("engines", instant_engine_argv(pp, dp, SIM_MODEL_8B))
        return f"instant engine pair (bench.instant_engine, model name {SIM_MODEL_8B})"
    for role, port in (("prefill", pp), ("decode", dp)):
        fleet.start(role, sim_engine_argv(port, role, SIM_MODEL_8B, SIM_HARDWARE, 1,
                                          opts.time_scale))
    return (f"sim {SIM_MODEL_8B} {SIM_HARDWARE} TP1 x (1 prefill + 1 decode), time scale "
            f"{opts.time_scale}")


def start_case(case: str, opts: RouterOptions, fleet: ProcessFleet, targets: list[str],
               router_bin: str) -> tuple[Urls, str]:
    """Engines, pdctl and vllm-router for ``case``, ready; the URLs and what the engines are."""
    pp, dp, cp, rp, rmp = (free_port() for _ in range(5))
    urls = Urls(*(f"http://127.0.0.1:{p}" for p in (pp, dp, cp, rp)))
    engines = start_engines(case, opts, fleet, pp, dp)
    # data_workers is named only when it is not 1: a --pdctl-root older than it runs so.
    workers = {"data_workers": opts.data_workers} if opts.data_workers != 1 else {}
    cfg = {"backend": "external", "model": {"name": SIM_MODEL_8B},
           "pools": {"prefill": {"urls": [urls.prefill], "tp": 1},
                     "decode": {"urls": [urls.decode], "tp": 1}},
           "routing": ROUTING,
           "controller": {"port": cp, **workers}}
    start_controller(fleet.workdir, cfg, name="pdctl", fleet=fleet,
                     pdctl_root=opts.pdctl_root, log_level="warning", wait="none")
    if "vllm-router" in targets:
        # Round robin on both pools, as pdctl above (the default cache_aware keeps a radix
        # tree of prompts); its own Prometheus port, so parallel runs do not collide on 29000.
        fleet.start("vllm-router", [
            router_bin, "--vllm-pd-disaggregation", "--prefill", urls.prefill,
            "--decode", urls.decode, "--host", "127.0.0.1", "--port", str(rp),
            "--kv-connector", "nixl", "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(rmp),
            "--log-level", "warning"])
    for url in (urls.prefill, urls.decode):
        wait_until(url, functools.partial(healthy, url), 90, fleet)
    wait_until("pdctl", lambda: httpx.get(f"{urls.pdctl}/healthz", timeout=2).json()["ready"]
               == {"prefill": 1, "decode": 1}, 90, fleet)
    if "vllm-router" in targets:
        wait_until("vllm-router", lambda: healthy(urls.router), 90, fleet)
    return urls, engines
