"""A real controller process with simulated engine processes: the OpenAI data plane through
the two-hop router, the accounting invariant, and the control API's auth and validation."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from pdctl_api.schema import PoolPlanPublic, PoolSize, Role
from tests.integration.harness import LONG_PROMPT, SHORT_PROMPT, ControllerProc, start_controller

COMPONENTS = ("queue_ms", "prefill_ms", "transfer_ms", "decode_sched_ms", "overhead_ms")


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    c = start_controller(tmp_path_factory.mktemp("ctl"))
    yield c
    c.stop()


@pytest.fixture
def sdk(ctl: ControllerProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{ctl.url}/v1", api_key="unused", max_retries=0)


def record(ctl: ControllerProc, rid: str) -> dict[str, object]:
    for r in ctl.get("/requests?limit=1000"):
        if r["id"] == rid:
            return dict(r)
    raise AssertionError(f"no record {rid}")


@pytest.mark.parametrize("prompt,path", [(LONG_PROMPT, "disaggregated"),
                                         (SHORT_PROMPT, "colocated")])
def test_sdk_completion_non_streaming(ctl: ControllerProc, sdk: openai.OpenAI, prompt: str,
                                      path: str) -> None:
    raw = sdk.completions.with_raw_response.create(
        model="llama-3-70b", prompt=prompt, max_tokens=6,
        extra_headers={"X-Request-Id": f"test-{path}"})
    assert raw.headers["x-request-id"] == f"test-{path}"
    out = raw.parse()
    assert out.usage is not None and out.usage.completion_tokens == 6
    assert out.choices[0].text
    rec = record(ctl, f"test-{path}")
    assert rec["path"] == path and rec["status"] == "ok"
    if path == "disaggregated":
        assert rec["prefill_instance"] and rec["kv_bytes"] > 0 and rec["transfer_ms"] > 0
    else:
        assert rec["prefill_instance"] is None and rec["kv_bytes"] == 0


def test_sdk_streaming_completion_and_chat(ctl: ControllerProc, sdk: openai.OpenAI) -> None:
    pieces = [c.choices[0].text for c in sdk.completions.create(
        model="llama-3-70b", prompt=LONG_PROMPT, max_tokens=5, stream=True) if c.choices]
    assert len("".join(pieces).split()) == 5
    chat = sdk.chat.completions.create(
        model="llama-3-70b", max_tokens=4,
        messages=[{"role": "user", "content": LONG_PROMPT}])
    assert chat.choices[0].message.content
    deltas = [c.choices[0].delta.content or "" for c in sdk.chat.completions.create(
        model="llama-3-70b", max_tokens=4, stream=True,
        messages=[{"role": "user", "content": SHORT_PROMPT}]) if c.choices]
    assert "".join(deltas).strip()


def test_disaggregated_output_equals_colocated(ctl: ControllerProc, sdk: openai.OpenAI) -> None:
    before = ctl.get("/routing")["disagg_min_prompt_tokens"]
    disagg = sdk.completions.create(model="llama-3-70b", prompt=LONG_PROMPT, max_tokens=8,
                                    temperature=0)
    ctl.api("PATCH", "/routing", {"disagg_min_prompt_tokens": 100_000}).raise_for_status()
    try:
        coloc = sdk.completions.create(model="llama-3-70b", prompt=LONG_PROMPT, max_tokens=8,
                                       temperature=0)
    finally:
        ctl.api("PATCH", "/routing", {"disagg_min_prompt_tokens": before}).raise_for_status()
    assert disagg.choices[0].text == coloc.choices[0].text
    paths = [r["path"] for r in ctl.get("/requests?limit=2")]
    assert paths == ["colocated", "disaggregated"]


def test_models_and_openai_errors(ctl: ControllerProc, sdk: openai.OpenAI) -> None:
    assert [m.id for m in sdk.models.list()] == ["llama-3-70b"]
    r = httpx.post(f"{ctl.url}/v1/completions", content=b"{not json", timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        sdk.completions.create(model="llama-3-70b", prompt=LONG_PROMPT, max_tokens=100_000)


def test_accounting_invariant_for_every_record(ctl: ControllerProc, sdk: openai.OpenAI) -> None:
    for i in range(6):
        sdk.completions.create(model="llama-3-70b", prompt=f"{i} {LONG_PROMPT}", max_tokens=3,
                               stream=bool(i % 2))
    records = ctl.get("/requests?limit=1000")
    assert len(records) >= 6
    for r in records:
        if r["status"] != "ok":
            continue
        parts = [r[c] for c in COMPONENTS]
        assert min(parts) >= 0, r
        assert sum(parts) == pytest.approx(r["ttft_ms"], abs=1e-6), r
        assert r["ttft_ms"] > 0
    disagg = [r for r in records if r["path"] == "disaggregated" and r["status"] == "ok"]
    assert disagg and all(r["prefill_ms"] > 0 and r["transfer_ms"] > 0 for r in disagg)
    stats = ctl.get("/stats?window_s=600")
    assert stats["requests"] >= 6 and stats["ttft_ms"]["p50"] > 0
    assert stats["components_ms"]["transfer"]["p99"] > 0
    series = ctl.get("/timeseries?window_s=600&step_s=10")["buckets"]
    assert len(series) == 60 and sum(b["requests"] for b in series) >= 6
    assert any(b["parts_mean_ms"]["transfer"] > 0 for b in series)
    text = httpx.get(f"{ctl.url}/metrics").text
    for name in ("pdctl_requests_total", "pdctl_ttft_seconds_bucket",
                 'pdctl_ttft_component_seconds_count{component="transfer"}',
                 "pdctl_kv_transfer_bytes_total", "pdctl_itl_seconds_count",
                 'pdctl_pool_desired_instances{role="decode"} 1.0',
                 'pdctl_instances{role="prefill",state="ready"} 1.0',
                 "pdctl_instance_running_requests{", "pdctl_instance_kv_cache_usage_ratio{"):
        assert name in text, name
    # The request histograms in vLLM's form, labelled with the served model.
    model = httpx.get(f"{ctl.url}/v1/models").json()["data"][0]["id"]
    ok = [r for r in records if r["status"] == "ok"]

    def sample(name: str) -> float:
        prefix = f'{name}{{model_name="{model}"}} '
        return float(next(x for x in text.splitlines() if x.startswith(prefix)).split()[-1])

    assert sample("pdctl_e2e_request_latency_seconds_count") == len(ok)
    assert sample("pdctl_request_prompt_tokens_sum") == sum(r["prompt_tokens"] for r in ok)
    assert sample("pdctl_request_generation_tokens_sum") == sum(r["output_tokens"] for r in ok)


def state_snapshot(ctl: ControllerProc) -> tuple[object, object, int]:
    c = ctl.get("/cluster")
    return c["pools"], c["routing"], ctl.get("/events?limit=1")[0]["id"]


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/cluster", None), ("PATCH", "/pools/decode", {"size": 2}),
    ("PATCH", "/pools/decode?dry_run=true", {"size": 2}),
    ("PATCH", "/routing", {"disagg_min_prompt_tokens": 1}), ("GET", "/requests", None),
    ("GET", "/stats", None), ("GET", "/advisor", None), ("GET", "/events", None),
    ("GET", "/instances", None), ("POST", "/instances/decode-2/drain", None),
])
@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_401_without_valid_token_changes_nothing(ctl: ControllerProc, method: str, path: str,
                                                 body: object, token: str | None) -> None:
    before = state_snapshot(ctl)
    r = ctl.api(method, path, body, token=token)
    assert r.status_code == 401 and "token" in r.json()["detail"]
    assert state_snapshot(ctl) == before


@pytest.mark.parametrize("path,body,needle", [
    ("/pools/decode", {"size": 100}, "accelerators"),
    ("/pools/decode", {"tp": 3}, "does not divide"),
    ("/pools/decode", {"tp": 16}, "per node"),
    ("/pools/decode", {"tp": 1}, "needs"),
    ("/pools/decode", {"size": 0}, "at least 1"),
    ("/pools/decode", {"size": -1}, "size"),
    ("/pools/decode", {"replicas": 2}, "replicas"),
    ("/pools/decode", {}, "nothing to change"),
    ("/pools/gpu", {"size": 1}, "role"),
    ("/routing", {"decode_policy": "random"}, "decode_policy"),
    ("/routing", {"disagg_min_prompt_tokens": -5}, "disagg_min_prompt_tokens"),
    ("/routing", {"transfer_alert_share": 2}, "transfer_alert_share"),
    ("/routing", {}, "nothing to change"),
])
def test_422_with_reason_changes_and_records_nothing(ctl: ControllerProc, path: str,
                                                     body: object, needle: str) -> None:
    before = state_snapshot(ctl)
    r = ctl.api("PATCH", path, body)
    assert r.status_code == 422, r.text
    assert needle in r.json()["detail"]
    assert state_snapshot(ctl) == before


@pytest.mark.parametrize("body,needle", [
    ({"size": 100}, "accelerators"), ({"tp": 3}, "does not divide"), ({"size": 0}, "at least 1"),
    ({"replicas": 2}, "replicas"), ({}, "nothing to change"),
])
def test_pool_dry_run_refuses_like_the_change_and_changes_nothing(
        ctl: ControllerProc, body: object, needle: str) -> None:
    before = state_snapshot(ctl)
    r = ctl.api("PATCH", "/pools/decode?dry_run=true", body)
    assert r.status_code == 422, r.text
    assert needle in r.json()["detail"]
    assert r.json() == ctl.api("PATCH", "/pools/decode", body).json()  # the same refusal
    assert state_snapshot(ctl) == before


def test_pool_dry_run_plans_a_scale_up_and_changes_nothing(ctl: ControllerProc) -> None:
    before = state_snapshot(ctl)
    r = ctl.api("PATCH", "/pools/decode?dry_run=true", {"size": 2})
    assert r.status_code == 200, r.text
    plan = PoolPlanPublic.model_validate(r.json())
    assert (plan.role, plan.desired) == (Role.DECODE, PoolSize(size=2, tp=2))
    starts = [a for a in plan.actions if a.kind == "start"]
    assert starts and all((a.role, a.tp) == (Role.DECODE, 2) for a in starts), r.json()
    assert all(a.reason for a in plan.actions)
    assert state_snapshot(ctl) == before  # no audit event, desired pools as they were
    assert ctl.get("/pools/decode")["desired"] == {"size": 1, "tp": 2, "kv_mode": "pull"}
    schemas = httpx.get(f"{ctl.url}/openapi.json", timeout=10).json()["components"]["schemas"]
    assert {"PoolPlanPublic", "PlannedAction", "ClusterPublic"} <= set(schemas)


def test_accepted_changes_land_in_the_audit_log(ctl: ControllerProc) -> None:
    r = ctl.api("PATCH", "/routing", {"transfer_alert_share": 0.3, "prefill_policy":
                                      "least_loaded"})
    assert r.status_code == 200 and r.json()["transfer_alert_share"] == 0.3
    ev = ctl.get("/events?limit=1")[0]
    assert ev["kind"] == "routing.update"
    assert ev["before"] == {"transfer_alert_share": 0.2, "prefill_policy": "round_robin"}
    assert ev["after"] == {"transfer_alert_share": 0.3, "prefill_policy": "least_loaded"}
    kinds = {e["kind"] for e in ctl.get("/events?limit=500")}
    assert {"controller.start", "instance.starting", "instance.ready"} <= kinds


def test_advisor_reports_ratio_verdict_and_kv(ctl: ControllerProc) -> None:
    adv = ctl.get("/advisor")
    assert adv["traffic"]["observed"] is True
    assert adv["fleet_ratio"]["decode_per_prefill_accelerators"] > 0
    assert adv["verdict"]["decision"] in {"colocate", "depends", "disaggregate",
                                          "strongly-disaggregate", "barely-pays"}
    assert adv["verdict"]["reasons"]
    assert adv["kv_transfer"]["link"] == "ib-ndr" and adv["kv_transfer"]["transfer_ms"] > 0


def pdctl(ctl: ControllerProc, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", *args, "--controller", ctl.url,
         "--state-dir", str(ctl.state_dir)], capture_output=True, text=True, timeout=60)


def test_cli_status_scale_route(ctl: ControllerProc) -> None:
    out = pdctl(ctl, "status")
    assert out.returncode == 0, out.stderr
    assert "decode" in out.stdout and "converged" in out.stdout
    bad = pdctl(ctl, "tp", "decode", "3")
    assert bad.returncode == 1 and "does not divide" in bad.stderr
    dry = pdctl(ctl, "scale", "decode", "2", "--dry-run")
    assert dry.returncode == 0 and "next step: start decode at TP2" in dry.stdout
    assert ctl.get("/pools/decode")["desired"]["size"] == 1
    ok = pdctl(ctl, "route", "disagg_min_prompt_tokens=300")
    assert ok.returncode == 0 and '"disagg_min_prompt_tokens": 300' in ok.stdout
    assert ctl.get("/events?limit=1")[0]["actor"] == "pdctl-cli"
    pdctl(ctl, "route", "disagg_min_prompt_tokens=256")


def test_bad_config_is_refused_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("pools:\n  decode:\n    tp: zero\n")
    out = subprocess.run([sys.executable, "-m", "controller.cli", "controller", "--config",
                          str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "pools.decode.tp" in out.stderr


def test_shutdown_stops_every_engine(tmp_path: Path) -> None:
    c = start_controller(tmp_path)
    urls = [i["url"] for i in c.get("/instances")]
    assert len(urls) == 2
    assert c.stop() == 0
    for url in urls:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=2)
    assert "controller.stop" in [e["kind"] for e in _events(c.state_dir)]


def _events(state_dir: Path) -> list[dict[str, object]]:
    from controller.store import Store

    store = Store(state_dir / "state.db")
    try:
        return store.events(100)
    finally:
        store.close()
