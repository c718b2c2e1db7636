"""The hand-off lab's probes, driver and report: decode hops under abnormal conditions, both
pairs run at once with requests interleaved, the table, the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench import handoff_lab
from bench.handoff_lab.engines import (
    CONNECTORS,
    DEAD_SIDE_PORT,
    LabEngine,
    make_pair,
    pair_settings,
    wait_engine_ready,
)
from bench.handoff_lab.measure import (
    HopResult,
    Trial,
    base_body,
    delta,
    disagg,
    make_prompt,
    post_json,
    post_stream,
    prefill_hop_body,
    push_decode_params,
    reference,
    same,
    scrape_metrics,
    summarize_trials,
    trial,
)
from controller.config import Settings

# --------------------------------------------------------------------------- probes


def probe(client: httpx.Client, pool: ThreadPoolExecutor, name: str, mode: str, p: LabEngine,
          d: LabEngine, prompt: list[int], timeout: float = 120.0, decode_delay_s: float = 0.0,
          params_fn: Any = None, skip_prefill: bool = False) -> dict[str, Any]:
    """A decode hop under abnormal conditions; what the client and /metrics can see."""
    before = scrape_metrics(client, d.url)
    p_before = scrape_metrics(client, p.url)
    rid = f"probe-{uuid.uuid4().hex[:12]}"
    t0 = time.perf_counter()
    ph: HopResult | None = None
    if mode == "pull" or skip_prefill:
        if not skip_prefill:
            ph = post_json(client, p.url, prefill_hop_body(prompt), rid, timeout)
        params = params_fn(ph.kv_params if ph else push_decode_params(p, rid))
        t0 = time.perf_counter()
        dh = post_stream(client, d.url, {**base_body(prompt), "kv_transfer_params": params},
                         rid, timeout)
    else:
        params = params_fn(push_decode_params(p, rid)) if params_fn else None
        ph, dh, t0 = disagg(client, pool, mode, p, d, prompt, timeout, decode_delay_s,
                            params)
    time.sleep(1.0)
    ref = reference(client, d, prompt)
    return {
        "probe": name, "mode": mode, "tokens": len(prompt),
        "decode_status": dh.status, "decode_error": dh.error,
        "equal_to_colocated": same(dh, ref),
        "decode_seconds": round(dh.t_done - t0, 3),
        "ttft_s": None if dh.t_first is None else round(dh.t_first - t0, 3),
        "prefill_status": ph.status if ph else None,
        "prefill_seconds": round(ph.t_done - t0, 3) if ph else None,
        "usage": dh.usage, "metrics": dh.metrics,
        "decode_counter_delta": delta(scrape_metrics(client, d.url), before),
        "prefill_counter_delta": delta(scrape_metrics(client, p.url), p_before),
    }


def with_port(port: int) -> Any:
    def fn(params: dict[str, Any]) -> dict[str, Any]:
        return {**params, "remote_port": port}
    return fn


def with_engine(engine_id: str) -> Any:
    def fn(params: dict[str, Any]) -> dict[str, Any]:
        return {**params, "remote_engine_id": engine_id}
    return fn


def with_engine_port(engine_id: str, port: int) -> Any:
    def fn(params: dict[str, Any]) -> dict[str, Any]:
        return {**params, "remote_engine_id": engine_id, "remote_port": port}
    return fn


# --------------------------------------------------------------------------- driver


def run_probes(client: httpx.Client, pool: ThreadPoolExecutor, mode: str, p: LabEngine,
               d: LabEngine, rng: random.Random, vocab: int, args: argparse.Namespace
               ) -> list[dict[str, Any]]:
    n = args.lengths[0]

    def prompt() -> list[int]:
        return make_prompt(rng, n, vocab)

    probes = [
        probe(client, pool, "dead port, known engine id", mode, p, d, prompt(),
              params_fn=with_port(DEAD_SIDE_PORT)),
        probe(client, pool, "unseen engine id at dead port", mode, p, d, prompt(),
              params_fn=with_engine_port("never-seen", DEAD_SIDE_PORT)),
        probe(client, pool, "wrong engine id, live port", mode, p, d, prompt(),
              params_fn=with_engine("no-such-engine")),
    ]
    if mode == "push":
        slow = args.push_registration_timeout + 25
        probes += [
            probe(client, pool, "decode hop 2 s before prefill hop", mode, p, d, prompt(),
                  decode_delay_s=-2.0),
            probe(client, pool, "decode hop 2 s after prefill hop", mode, p, d, prompt(),
                  timeout=slow, decode_delay_s=2.0),
            probe(client, pool, "prefill never sent (orphan registration)", mode, p, d,
                  prompt(), timeout=slow, params_fn=lambda x: x, skip_prefill=True),
        ]
        if args.lease_probe:
            probes.append(probe(client, pool, "decode hop after lease expiry", mode, p, d,
                                prompt(), timeout=slow, decode_delay_s=35.0))
    for pr in probes:
        print(f"[{mode}] probe {pr['probe']}: status={pr['decode_status']} "
              f"equal={pr['equal_to_colocated']} t={pr['decode_seconds']} "
              f"err={pr['decode_error']} D={pr['decode_counter_delta']}", flush=True)
    return probes


def run_all(args: argparse.Namespace, settings: Settings, logdir: Path, vocab: int
            ) -> list[dict[str, Any]]:
    """Both pairs at once (pull P+D and push P+D; prefills on core 0, decodes on core 1),
    requests interleaved pull/push, one at a time."""
    modes = args.modes.split(",")
    pairs = {m: make_pair(m, args, logdir) for m in modes}
    out: dict[str, dict[str, Any]] = {
        m: {"mode": m, "connector": CONNECTORS[m], "prefill_engine_id": p.engine_id,
            "logs": [str(p.log_path), str(d.log_path)], "layout": "concurrent, interleaved"}
        for m, (p, d) in pairs.items()}
    rngs = {m: random.Random(f"{args.seed}-{m}") for m in modes}
    pool = ThreadPoolExecutor(max_workers=4)
    engines = [e for pair in pairs.values() for e in pair]
    try:
        with httpx.Client() as client:
            t_start = time.monotonic()
            for m, (p, d) in pairs.items():
                p.start(settings)
                d.start(settings)
                out[m]["argv_prefill"] = p.command(settings)[0]
                out[m]["argv_decode"] = d.command(settings)[0]
            wait_engine_ready(client, engines, args.start_timeout)
            print(f"engines ready in {time.monotonic() - t_start:.0f} s", flush=True)
            for m, (p, d) in pairs.items():
                w = trial(client, pool, m, p, d, make_prompt(rngs[m], 150, vocab))
                out[m]["first_request"] = w.__dict__
                print(f"[{m}] first request (handshake): status {w.prefill_status}/"
                      f"{w.decode_status} equal={w.equal} ttft={w.ttft_s} err={w.error}",
                      flush=True)
            before = {m: scrape_metrics(client, d.url) for m, (_, d) in pairs.items()}
            trials: dict[str, list[Trial]] = {m: [] for m in modes}
            for i in range(args.requests):
                for n in args.lengths:
                    for m in (modes if i % 2 == 0 else modes[::-1]):
                        p, d = pairs[m]
                        t = trial(client, pool, m, p, d, make_prompt(rngs[m], n, vocab))
                        trials[m].append(t)
                        print(f"[{m}] #{i} {n} tok: ttft={t.ttft_s and round(t.ttft_s, 3)} "
                              f"handoff={t.handoff_s and round(t.handoff_s, 3)} "
                              f"prefill_hop={round(t.prefill_s, 3)} equal={t.equal} "
                              f"status={t.prefill_status}/{t.decode_status} err={t.error}",
                              flush=True)
            for m, (_, d) in pairs.items():
                out[m]["decode_counter_delta"] = delta(scrape_metrics(client, d.url), before[m])
                out[m]["trials"] = [t.__dict__ for t in trials[m]]
                out[m]["summary"] = summarize_trials(trials[m], args.lengths)
            if not args.no_probes:
                for m, (p, d) in pairs.items():
                    out[m]["probes"] = run_probes(client, pool, m, p, d, rngs[m], vocab, args)
            for m, (p, d) in pairs.items():
                pat = r"ERROR|Traceback|WARNING.*(nixl|Nixl|NIXL|KV|push|Push)|Exception"
                out[m]["decode_log_notable"] = d.log_tail(60, pat)
                out[m]["prefill_log_notable"] = p.log_tail(60, pat)
    except Exception as exc:  # record what the engines said
        for m, (p, d) in pairs.items():
            out[m]["error"] = f"{type(exc).__name__}: {exc}"
            out[m]["decode_log_tail"] = d.log_tail(80)
            out[m]["prefill_log_tail"] = p.log_tail(80)
        print(f"FAILED: {type(exc).__name__}: {exc}", flush=True)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        for eng in engines:
            eng.stop()
    return list(out.values())


def table(results: list[dict[str, Any]], lengths: list[int]) -> str:
    by = {r["mode"]: r.get("summary", {}) for r in results}
    rows = ["tokens | TTFT pull | TTFT push | hand-off pull | hand-off push | equal pull/push",
            "-------|-----------|-----------|---------------|---------------|----------------"]

    def g(mode: str, n: int, key: str) -> str:
        v = by.get(mode, {}).get(str(n), {}).get(key)
        return "-" if v is None else (f"{v * 1000:.0f} ms" if isinstance(v, float) else str(v))

    for n in lengths:
        rows.append(f"{n} | {g('pull', n, 'ttft_s')} | {g('push', n, 'ttft_s')} | "
                    f"{g('pull', n, 'handoff_s')} | {g('push', n, 'handoff_s')} | "
                    f"{g('pull', n, 'equal')}/{g('push', n, 'equal')}")
    return "\n".join(rows)


@contextlib.contextmanager
def logs_dir(path: str | None) -> Iterator[Path]:
    if path:
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        yield p
    else:
        yield Path(tempfile.mkdtemp(prefix="handoff-lab-"))


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (a timeout, an operator) unwinds like Ctrl-C: the engines are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    doc = handoff_lab.__doc__
    ap = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    ap.add_argument("--requests", type=int, default=3, help="requests per length and mode")
    ap.add_argument("--json", help="write all results to this file")
    ap.add_argument("--model", default="lab-model")
    ap.add_argument("--modes", default="pull,push")
    ap.add_argument("--lengths", default="200,800,1500")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--logs", help="engine log folder (default: a new temp folder)")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--push-registration-timeout", type=float, default=15.0,
                    help="push engines' kv_connector_extra_config.push_registration_timeout")
    ap.add_argument("--no-probes", action="store_true")
    ap.add_argument("--lease-probe", action="store_true",
                    help="push: also a decode hop sent 35 s after its prefill (slow)")
    args = ap.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    model = Path(args.model)
    if not (model / "config.json").is_file():
        print(f"no model at {model}: run `pdctl make-model {model}`", file=sys.stderr)
        return 2
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(model / "tokenizer.json")).get_vocab_size()
    settings = pair_settings(model)
    with logs_dir(args.logs) as logdir:
        print(f"engine logs in {logdir}", flush=True)
        results = run_all(args, settings, logdir, vocab)
    print(table(results, args.lengths))
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=1, default=str))
    return 0 if all("error" not in r for r in results) else 1

