"""The CPU compose lab (docker/compose.cpu.yml) built and run for real, then checked as a user
would check it: through its published ports on 127.0.0.1, on the network Compose makes for
the project.

Built from the repository's Dockerfiles on a local Debian base image (no registry here:
tests/docker/engine.py). Everything but Grafana runs: no Grafana image or package can be had
here, so its provisioning is checked against its documented schema in
tests/prometheus/test_compose.py, and every query of its dashboard is run here against the
lab's live Prometheus. The project name is the test's own, never a user's ``pdctl-cpu``, and
its ports are free ones, given through the file's knobs. Timings go to
``artifacts/docker-lab.json``."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.models import Role
from pdctl_api.client import PdctlClient
from tests.docker.engine import (
    BASE_IMAGE,
    DOCKER,
    DOCKER_DIR,
    PROMETHEUS_IMAGE,
    ROOT,
    Compose,
    docker_engine,
    drop_replaced,
    ensure_base_image,
    fill_build_inputs,
    image_id,
    image_size_mb,
    run,
)
from tests.integration.harness import free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(3600)]

PROJECT = "pdctl-test-cpu"
SERVICES = ["controller", "prometheus", "console"]  # all but grafana (no image here)
LONG = "the model layer decode cache token batch " * 40  # ~300 tokens: above the 128 threshold
READY_S = 1200
ARTIFACT = ROOT / "artifacts" / "docker-lab.json"
TIMINGS: dict[str, Any] = {}


def record(**figures: Any) -> None:
    TIMINGS.update(figures)
    ARTIFACT.parent.mkdir(exist_ok=True)
    ARTIFACT.write_text(json.dumps(TIMINGS, indent=1) + "\n")


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Compose]:
    """The images built (timed), the project's knobs set; ``down -v`` at the end whatever
    happened, and the engine stopped if it was started here."""
    with docker_engine(tmp_path_factory.mktemp("dockerd")):
        record(base_image_s=round(ensure_base_image(), 1))
        torch_wheel = fill_build_inputs()
        ports = {k: str(free_port()) for k in
                 ("PDCTL_PORT", "CONSOLE_PORT", "PROMETHEUS_PORT", "GRAFANA_PORT")}
        c = Compose(PROJECT, "compose.cpu.yml", {
            **ports, "BASE_IMAGE": BASE_IMAGE, "PROMETHEUS_IMAGE": PROMETHEUS_IMAGE,
            **({"TORCH_INDEX_URL": ""} if torch_wheel else {})})
        c("down", "-v", "--remove-orphans", check=False)  # a run cut off before
        images = ("pdctl:cpu", "pdctl:console", PROMETHEUS_IMAGE)
        before = {name: image_id(name) for name in images}
        t0 = time.monotonic()
        run([DOCKER, "build", "-q", "-f", str(DOCKER_DIR / "Dockerfile.prometheus"),
             "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "-t", PROMETHEUS_IMAGE, str(DOCKER_DIR)],
            timeout=900, env=c.env)
        t1 = time.monotonic()
        c("build", "controller", "console", timeout=2400)
        record(prometheus_build_s=round(t1 - t0, 1),
               build_s=round(time.monotonic() - t1, 1),
               image_mb={name: round(image_size_mb(name)) for name in images},
               replaced_images_removed=len(drop_replaced(before)))
        try:
            yield c
        finally:
            logs = c("logs", "--no-color", "--tail", "200", check=False)
            down = c("down", "-v", "--remove-orphans", timeout=600, check=False)
            (ARTIFACT.parent / "docker-lab.log").write_text(
                logs.stdout + logs.stderr + down.stdout + down.stderr)
            left = c.containers() + c.volumes()
            c.remove_all()
            assert down.returncode == 0 and not left, (down.stderr[-2000:], left)


def token(c: Compose) -> str:
    return c("exec", "-T", "controller", "cat", "/var/lib/pdctl/token").stdout.strip()


def wait_ready(c: Compose, timeout: float) -> PdctlClient:
    """The controller container healthy, its token readable and both pools converged."""
    url = f"http://127.0.0.1:{c.knobs['PDCTL_PORT']}"
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        state = c.inspect("controller")["State"]
        assert isinstance(state, dict)
        assert state["Status"] in ("created", "running", "restarting"), state
        try:
            if state.get("Health", {}).get("Status") == "healthy":
                api = PdctlClient(url, token(c), actor="compose-test")
                pools = api.cluster().pools
                last = repr({r: (p.desired, p.actual, p.converged) for r, p in pools.items()})
                if all(p.converged for p in pools.values()):
                    return api
                api.close()
        except (httpx.HTTPError, AssertionError) as e:
            last = repr(e)
        time.sleep(2)
    logs = c("logs", "--no-color", "--tail", "80", "controller", check=False).stdout
    raise AssertionError(f"not ready after {timeout:.0f} s: {last}\n{logs}")


@pytest.fixture(scope="module")
def lab(compose: Compose) -> Iterator[PdctlClient]:
    t0 = time.monotonic()
    compose("up", "-d", "--no-build", *SERVICES, timeout=600)
    api = wait_ready(compose, READY_S)
    record(start_to_ready_s=round(time.monotonic() - t0, 1))
    yield api
    api.close()


def complete(c: Compose, prompt: str, max_tokens: int = 4) -> dict[str, Any]:
    r = httpx.post(f"http://127.0.0.1:{c.knobs['PDCTL_PORT']}/v1/completions", timeout=300,
                   json={"model": "lab-tiny", "prompt": prompt, "max_tokens": max_tokens,
                         "ignore_eos": True})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


class Traffic:
    """Long prompts, one at a time, until stopped: counters that move for the rate queries."""

    def __init__(self, c: Compose) -> None:
        self.c, self.done, self.errors = c, threading.Event(), list[str]()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        n = 0
        while not self.done.is_set():
            try:
                complete(self.c, f"{n} {LONG}")
            except (AssertionError, httpx.HTTPError) as e:
                self.errors.append(repr(e))
            n += 1

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join(timeout=300)


def test_a_disaggregated_completion_through_the_published_port(compose: Compose,
                                                                 lab: PdctlClient) -> None:
    body = complete(compose, LONG)
    assert body["choices"][0]["text"] and "kv_transfer_params" not in body
    rec = lab.requests(limit=1)[0]  # the newest: nothing else is sent meanwhile
    assert rec.prompt_tokens == body["usage"]["prompt_tokens"]
    assert (rec.path, rec.status) == ("disaggregated", "ok")
    assert rec.prefill_instance and rec.decode_instance and rec.kv_bytes > 0
    assert rec.transfer_ms > 0 and rec.prompt_tokens > 128


def test_both_data_plane_processes_serve_disaggregated_over_nixl(compose: Compose,
                                                                lab: PdctlClient) -> None:
    # The CPU compose lab runs the data plane in two processes (DATA_WORKERS, 2): the
    # controller's and a router worker, on the one published port.
    [worker] = lab.cluster().router_workers
    before = worker.arrived
    for i in range(12):  # a connection each: the kernel spreads them over both processes
        assert complete(compose, f"{i} {LONG}")["usage"]["completion_tokens"] == 4
    by_worker = lab.cluster().router_workers[0].arrived - before
    assert 0 < by_worker < 12, by_worker
    recs = lab.requests(limit=12)
    assert [(r.path, r.status) for r in recs] == [("disaggregated", "ok")] * 12
    assert all(r.kv_bytes > 0 for r in recs)


def test_prometheus_scrapes_the_controller_and_both_engines(compose: Compose,
                                                            lab: PdctlClient) -> None:
    url = f"http://127.0.0.1:{compose.knobs['PROMETHEUS_PORT']}/api/v1/targets"
    deadline, health = time.monotonic() + 120, {}
    while time.monotonic() < deadline:
        active = httpx.get(url, timeout=10).json()["data"]["activeTargets"]
        health = {(t["labels"]["job"], t["labels"].get("role", "")): t["health"] for t in active}
        if list(health.values()).count("up") == 3:
            break
        time.sleep(2)
    assert health == {("pdctl-controller", ""): "up", ("pdctl-engines", "prefill"): "up",
                      ("pdctl-engines", "decode"): "up"}


def grafana_queries() -> list[tuple[str, str]]:
    dash = json.loads((DOCKER_DIR / "grafana" / "dashboards" / "pdctl.json").read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def test_every_grafana_panel_query_returns_data(compose: Compose, lab: PdctlClient) -> None:
    """Grafana's own queries, with ``$__rate_interval`` as Grafana sets it at a 10 s scrape
    interval (4 scrapes), against the lab's Prometheus while requests flow."""
    url = f"http://127.0.0.1:{compose.knobs['PROMETHEUS_PORT']}/api/v1/query"
    queries = grafana_queries()
    assert len(queries) >= 10
    empty = {f"{title}: {expr}" for title, expr in queries}
    with Traffic(compose) as traffic:
        deadline = time.monotonic() + 240
        while empty and time.monotonic() < deadline:
            for title, expr in queries:
                got = httpx.get(url, params={"query": expr.replace("$__rate_interval", "40s")},
                                timeout=10).json()
                assert got["status"] == "success", (title, got)
                values = [float(s["value"][1]) for s in got["data"]["result"]]
                # A series with a number: a rate ratio is NaN (0/0) in a window that saw no
                # transfer finish, which the real lab's slow requests sometimes leave.
                if [v for v in values if v == v]:
                    empty.discard(f"{title}: {expr}")
            time.sleep(5)
    assert sorted(empty) == []
    assert traffic.errors == []


def test_the_console_renders_live_figures_in_chromium(compose: Compose, lab: PdctlClient,
                                                      tmp_path: Path) -> None:
    from playwright.sync_api import Page, expect, sync_playwright

    from tests.integration.test_console_browser import CHROMIUM, CHROMIUM_ARGS, DRAWN, SHOTS, ms

    def metric(page: Page, label: str) -> float:
        card = page.locator('[data-testid="stMetric"]').filter(
            has=page.locator('[data-testid="stMetricLabel"]', has_text=re.compile(
                f"^{re.escape(label)}$")))
        return ms(card.first.locator('[data-testid="stMetricValue"]').inner_text())

    console = f"http://127.0.0.1:{compose.knobs['CONSOLE_PORT']}"
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.new_page()
            t0 = time.monotonic()
            page.goto(console)
            # The console's first page view in a fresh container imports pandas and Altair
            # from a cold image: timed, and given room on a CI machine the engines keep busy.
            expect(page.locator("h1").first).to_have_text("Overview", timeout=240_000)
            record(console_first_view_s=round(time.monotonic() - t0, 1))
            with Traffic(compose) as traffic:
                parts = ("prefill", "KV transfer", "decode scheduling")
                deadline = time.monotonic() + 180
                while not all(metric(page, p) > 0 for p in parts):
                    assert time.monotonic() < deadline, {p: metric(page, p) for p in parts}
                    page.wait_for_timeout(1000)
                page.locator(DRAWN).nth(4).wait_for(timeout=60_000)  # 5 charts, 6 from Prom.
                expect(page.get_by_text("cannot reach")).to_have_count(0)
                SHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=SHOTS / "compose-overview.png", full_page=True)
        finally:
            ctx.close()
    assert traffic.errors == []


def test_pdctl_fault_rehearses_a_killed_prefill_inside_the_controller_container(
        compose: Compose, lab: PdctlClient) -> None:
    """``pdctl fault`` where an operator of the compose lab runs it: in the controller's
    container, which holds the engines' processes and the state directory's token."""
    victim = [i.id for i in lab.instances("prefill") if i.state == "ready"]
    out = compose("exec", "-T", "controller", "pdctl", "fault", "kill-prefill",
                  "--state-dir", "/var/lib/pdctl", "--reference", "--ignore-eos",
                  "--requests", "8", "--concurrency", "2", "--recover-timeout", str(READY_S),
                  "--json", timeout=READY_S + 600, check=False)
    report = json.loads(out.stdout) if out.stdout.startswith("{") else {}
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert [report["target"]] == victim and len(report["checks"]) == 6, report
    failed = lab.events(kind="instance.failed", limit=5)
    assert failed and failed[0].target == victim[0], failed


def test_a_pool_change_survives_a_restart_of_the_controller(compose: Compose,
                                                            lab: PdctlClient) -> None:
    """Prefill 1 -> 0 through the API; after ``restart controller`` the desired size is 0,
    no prefill engine comes back, and long prompts are served colocated."""
    lab.set_pool("prefill", size=0)
    deadline = time.monotonic() + 300
    while not lab.pool("prefill").converged:
        assert time.monotonic() < deadline, lab.pool("prefill")
        time.sleep(2)
    t0 = time.monotonic()
    compose("restart", "controller", timeout=300)
    api = wait_ready(compose, READY_S)
    record(restart_to_ready_s=round(time.monotonic() - t0, 1))
    try:
        cluster = api.cluster()
        assert cluster.pools[Role.PREFILL].desired.size == 0
        assert [i.role for i in cluster.instances if i.state == "ready"] == ["decode"]
        events = api.events(kind="pool.update")
        assert events[0].actor == "compose-test" and events[0].after == {"size": 0, "tp": 1,
                                                                     "kv_mode": "pull"}
        body = complete(compose, LONG)
        rec = api.requests(limit=1)[0]
        assert rec.prompt_tokens == body["usage"]["prompt_tokens"]
        assert rec.path == "colocated" and rec.status == "ok"
    finally:
        api.close()


def test_down_stops_everything_and_down_v_removes_the_volumes(compose: Compose,
                                                              lab: PdctlClient) -> None:
    compose("stop", timeout=600)
    for service in SERVICES:  # each stopped on SIGTERM, none killed at the grace period's end
        state = compose.inspect(service)["State"]
        assert isinstance(state, dict) and state["ExitCode"] in (0, 143), (service, state)
    state = compose.inspect("controller")["State"]
    assert isinstance(state, dict) and state["ExitCode"] == 0, state  # engines stopped in time
    log = compose("logs", "--no-color", "controller").stdout
    assert "Traceback" not in log
    compose("down", timeout=300)
    assert compose.containers() == [] and compose.networks() == []
    kept = {re.sub(f"^{PROJECT}_", "", v) for v in compose.volumes()}
    assert {"pdctl-state", "models", "prometheus-data"} <= kept <= {
        "pdctl-state", "models", "prometheus-data", "grafana-data"}, kept
    compose("down", "-v", timeout=300)
    assert compose.volumes() == []
