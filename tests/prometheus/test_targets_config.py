"""The engine target list, the scrape configuration and how ``pdctl lab`` decides to start
Prometheus; no Prometheus process here (``promtool`` only)."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from controller.cli import serve
from controller.config import PrometheusSettings, Settings
from controller.models import Instance, InstanceState, Role
from controller.obs import prometheus

S = InstanceState


def inst(iid: str, state: InstanceState, url: str = "", role: Role = Role.DECODE) -> Instance:
    return Instance(iid, role, 1, url or f"http://127.0.0.1:{9000 + len(iid)}", state=state)


def test_only_serving_instances_are_targets_with_id_and_role() -> None:
    instances = [inst("decode-3", S.READY, "http://127.0.0.1:9003"),
                 inst("prefill-1", S.DRAINING, "http://127.0.0.1:9001", Role.PREFILL),
                 inst("decode-4", S.STARTING), inst("decode-5", S.STOPPED),
                 inst("decode-6", S.FAILED)]
    assert prometheus.engine_targets(instances) == [
        {"targets": ["127.0.0.1:9003"], "labels": {"instance": "decode-3", "role": "decode"}},
        {"targets": ["127.0.0.1:9001"], "labels": {"instance": "prefill-1", "role": "prefill"}},
    ]


def test_external_urls_keep_scheme_and_path() -> None:
    group = prometheus.target_group(inst("decode-1", S.READY, "https://gpu-7:8443/engine/"))
    assert group == {"targets": ["gpu-7:8443"], "labels": {
        "instance": "decode-1", "role": "decode", "__scheme__": "https",
        "__metrics_path__": "/engine/metrics"}}


def test_targets_file_is_rewritten_only_on_change(tmp_path: Path) -> None:
    path = tmp_path / "prometheus" / "engines.json"
    f = prometheus.TargetsFile(path)
    ready = [inst("decode-1", S.READY, "http://127.0.0.1:9001")]
    assert f.update(ready) is True
    assert json.loads(path.read_text())[0]["labels"]["instance"] == "decode-1"
    assert oct(path.stat().st_mode & 0o777) == "0o644"  # Prometheus may run as another user
    ready[0].running = 3.0  # load changes are not membership changes
    assert f.update(ready) is False
    ready[0].state = S.STOPPED
    assert f.update(ready) is True and json.loads(path.read_text()) == []
    assert [p.name for p in path.parent.iterdir()] == ["engines.json"]  # no temporary left
    prometheus.clear_targets(path)
    assert json.loads(path.read_text()) == []


@pytest.mark.parametrize(("seconds", "text"), [(10.0, "10s"), (2.0, "2s"), (0.5, "500ms"),
                                               (1.25, "1250ms"), (60, "60s")])
def test_duration(seconds: float, text: str) -> None:
    assert prometheus.duration(seconds) == text


def test_generated_config_passes_promtool(tmp_path: Path, promtool: str) -> None:
    interval = PrometheusSettings().scrape_interval_s
    assert interval == 10.0  # bounds Prometheus's target changes (controller/obs/prometheus.py)
    path = prometheus.write_config(tmp_path, "127.0.0.1:8080", interval)
    prometheus.write_json_atomic(prometheus.targets_path(tmp_path), prometheus.engine_targets(
        [inst("decode-1", S.READY, "http://127.0.0.1:9001")]))
    cfg = yaml.safe_load(path.read_text())
    assert cfg["global"]["scrape_interval"] == cfg["global"]["scrape_timeout"] == "10s"
    assert cfg["global"]["evaluation_interval"] == "10s"
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["pdctl-controller"]["static_configs"] == [{"targets": ["127.0.0.1:8080"]}]
    assert jobs["pdctl-controller"]["honor_labels"] is True
    sd = jobs["pdctl-engines"]["file_sd_configs"][0]["files"]
    assert sd == [str((tmp_path / "prometheus" / "engines.json").resolve())]
    # promtool also reads the file_sd file the config names, so the targets are checked too.
    out = subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr and "WARNING" not in out.stdout + out.stderr


def test_promtool_rejects_a_broken_targets_file(tmp_path: Path, promtool: str) -> None:
    path = prometheus.write_config(tmp_path, "127.0.0.1:8080", 2.0)
    prometheus.targets_path(tmp_path).write_text('[{"targets": "not a list"}]')
    out = subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0  # so the passing check above means something


def test_unavailable_says_why() -> None:
    assert prometheus.unavailable(PrometheusSettings(binary="true")) is None
    missing = prometheus.unavailable(PrometheusSettings(binary="no-such-prometheus"))
    assert missing is not None
    assert "no `no-such-prometheus` executable on PATH" in missing
    assert "apt-get install prometheus" in missing
    off = prometheus.unavailable(PrometheusSettings(enabled=False))
    assert off is not None and "--no-prometheus" in off


def test_prometheus_argv_has_short_retention_under_the_state_dir(tmp_path: Path) -> None:
    argv = prometheus.argv("/usr/bin/prometheus", tmp_path / "p.yml", tmp_path / "data",
                           "127.0.0.1:9999", "6h")
    assert argv == ["/usr/bin/prometheus", f"--config.file={tmp_path / 'p.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    "--storage.tsdb.retention.time=6h",
                    "--web.listen-address=127.0.0.1:9999",
                    "--scrape.discovery-reload-interval=1s", "--log.level=warn"]


def lab_args(*extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve.add_lab_parser(p.add_subparsers(dest="verb"))
    return p.parse_args(["lab", "--backend", "sim", *extra])


def test_lab_flags_reach_the_prometheus_settings() -> None:
    assert serve.lab_settings(lab_args()).prometheus.enabled is True
    s = serve.lab_settings(lab_args("--no-prometheus", "--prometheus-port", "9555"))
    assert (s.prometheus.enabled, s.prometheus.port) == (False, 9555)


def test_lab_without_the_binary_says_it_is_skipped_and_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(prometheus={"binary": str(tmp_path / "prometheus")},
                        controller={"state_dir": tmp_path})
    st = SimpleNamespace(settings=settings)
    proc, line = asyncio.run(serve.start_lab_prometheus(st))
    assert proc is None
    assert line.startswith("not started: no `") and "executable on PATH" in line
    assert "Prometheus skipped: no `" in capsys.readouterr().err


def test_lab_reports_a_prometheus_that_fails_to_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "prometheus"
    fake.write_text("#!/bin/sh\necho 'bad flag' >&2\nexit 3\n")
    fake.chmod(0o755)
    settings = Settings(prometheus={"binary": str(fake)}, controller={"state_dir": tmp_path})
    proc, line = asyncio.run(serve.start_lab_prometheus(
        SimpleNamespace(settings=settings)))
    assert proc is None
    assert "failed to start: prometheus exited with status 3" in line and "bad flag" in line
    assert "Prometheus skipped" in capsys.readouterr().err
