"""The docker/ set-up without a docker engine: both compose files validated against the
Compose Specification's JSON schema (after interpolating docker/.env, as Compose does), every
file they reference present, the Dockerfiles, the pdctl and Prometheus configurations they
mount, and Grafana's provisioning and dashboard.

The schema is the official ``compose-spec.json`` (github.com/compose-spec/compose-spec,
``schema/compose-spec.json``) as vendored by the ``check-jsonschema`` package from PyPI (its
``compose-spec`` pre-commit hook); nothing of it is copied into this repository.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from controller.config import PrometheusSettings, load_settings
from controller.obs import alerts, prometheus
from dashboard import prom

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_FILES = ["compose.cpu.yml", "compose.gpu.yml"]
NAME = r"[A-Za-z_][A-Za-z0-9_]*"
VAR = re.compile(rf"\$(?:\$|\{{({NAME})(?:(:?[-?])([^}}]*))?\}}|({NAME}))")


def compose_schema() -> dict[str, Any]:
    ref = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads((ref / "compose-spec.json").read_text())
    return schema


def dotenv(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def interpolate(value: Any, env: dict[str, str], used: set[str]) -> Any:
    """Compose's variable interpolation: ``$VAR``, ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?error}``, ``$$`` for a literal ``$``."""
    if isinstance(value, dict):
        return {k: interpolate(v, env, used) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, used) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        used.add(name)
        op, arg = m.group(2), m.group(3) or ""
        got = env.get(name)
        if op in (":-", ":?") and not got or op in ("-", "?") and got is None:
            if op.endswith("?"):
                raise AssertionError(f"{name} unset: {arg}")
            return arg
        return got or ""

    return VAR.sub(one, value)


def load_compose(name: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], set[str]]:
    raw = yaml.safe_load((DOCKER / name).read_text())
    used: set[str] = set()
    return interpolate(raw, dotenv(DOCKER / ".env") if env is None else env, used), used


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_file_is_valid_against_the_compose_spec(name: str) -> None:
    schema = compose_schema()
    assert schema["title"] == "Compose Specification"
    validator = jsonschema.Draft202012Validator(schema)
    doc, _ = load_compose(name)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(doc)]
    assert errors == []


def test_the_schema_catches_mistakes() -> None:
    """A wrong key, a wrong type: the validation above is not vacuous."""
    validator = jsonschema.Draft202012Validator(compose_schema())
    doc, _ = load_compose("compose.gpu.yml")
    doc["services"]["controller"]["deploy"]["resources"]["reservations"]["gpus"] = 1
    doc["services"]["grafana"]["ports"] = "3000:3000"
    assert len(list(validator.iter_errors(doc))) >= 2


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_every_variable_is_a_knob_in_the_env_file(name: str) -> None:
    _, used = load_compose(name)
    assert used - dotenv(DOCKER / ".env").keys() == set()


def test_a_missing_model_dir_is_refused_with_the_reason() -> None:
    env = {k: v for k, v in dotenv(DOCKER / ".env").items() if k != "MODEL_DIR"}
    with pytest.raises(AssertionError, match="set MODEL_DIR in docker/.env"):
        load_compose("compose.gpu.yml", env)


def dockerfile_args_and_copies(path: Path) -> tuple[set[str], list[str]]:
    args, copies = set(), []
    for line in path.read_text().splitlines():
        words = line.split()
        if words[:1] == ["ARG"]:
            args.add(words[1].split("=")[0])
        elif words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copies += [w for w in words[1:-1] if not w.startswith("--")]
    return args, copies


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_every_referenced_file_exists(name: str) -> None:
    doc, _ = load_compose(name)
    assert (DOCKER / ".env").is_file()
    volumes = set(doc.get("volumes", {}))
    for svc_name, svc in doc["services"].items():
        build = svc.get("build")
        if build:
            context = (DOCKER / build["context"]).resolve()
            dockerfile = context / build["dockerfile"]
            assert dockerfile.is_file(), f"{svc_name}: {dockerfile}"
            declared, copies = dockerfile_args_and_copies(dockerfile)
            assert set(build.get("args", {})) <= declared, f"{svc_name}: undeclared build args"
            for src in copies:
                assert (context / src).exists(), f"{dockerfile}: COPY {src}"
            ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
            assert ignore.is_file(), f"{ignore}: keeps .venv out of the build context"
        for f in svc.get("env_file", []):
            assert (DOCKER / f).is_file()
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{svc_name}: {vol}"
            elif not source.startswith("/"):
                assert source in volumes, f"{svc_name}: undeclared volume {source}"
        assert "image" in svc


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_services_fit_together(name: str) -> None:
    """What the schema cannot say: references between services, and the paths the
    controller, Prometheus, the console and Grafana agree on."""
    doc, _ = load_compose(name)
    services = doc["services"]
    for svc in services.values():
        deps = svc.get("depends_on", {})
        assert set(deps) <= set(services)
    prom_svc = services["prometheus"]
    assert prom_svc["network_mode"] == "service:controller" and "ports" not in prom_svc
    # Target changes applied within one scrape interval, as in the lab (obs/prometheus.py)
    reload_flag = f"--scrape.discovery-reload-interval={prometheus.DISCOVERY_RELOAD}"
    assert reload_flag in prom_svc["command"]
    ports = [p.split(":")[-1] for p in services["controller"]["ports"]]
    assert ports == ["8080", "9090"]
    # The controller's state volume, where it writes the targets file, is Prometheus's too.
    state_mount = "pdctl-state:/var/lib/pdctl"
    assert state_mount in services["controller"]["volumes"]
    assert state_mount + ":ro" in prom_svc["volumes"]
    assert state_mount + ":ro" in services["console"]["volumes"]  # the API token
    config_file = services["controller"]["volumes"][0].split(":")[0]
    settings = load_settings(DOCKER / config_file)
    assert str(settings.controller.state_dir) == "/var/lib/pdctl"
    assert settings.controller.host == "0.0.0.0" and settings.controller.port == 8080
    assert settings.backend == "vllm"
    console = services["console"]["command"]
    assert "--prometheus=http://controller:9090" in console
    assert "--controller=http://controller:8080" in console
    assert services["grafana"]["environment"]["PROMETHEUS_URL"] == "http://controller:9090"


def test_gpu_compose_reserves_gpus_and_runs_vllm_with_nixl() -> None:
    doc, _ = load_compose("compose.gpu.yml")
    ctl = doc["services"]["controller"]
    devices = ctl["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    dockerfile = (DOCKER / "Dockerfile.gpu").read_text()
    assert re.search(r"^FROM \$\{VLLM_IMAGE\}$", dockerfile, re.M)
    assert ctl["build"]["args"]["VLLM_IMAGE"].startswith("vllm/vllm-openai:")
    assert 'pip install "nixl==${NIXL_VERSION}"' in dockerfile


def test_compose_prometheus_config_is_the_generated_one(promtool: str,
                                                       tmp_path: Path) -> None:
    path = DOCKER / "prometheus" / "prometheus.yml"
    expected = prometheus.render_config("127.0.0.1:8080",
                                        "/var/lib/pdctl/prometheus/engines.json",
                                        PrometheusSettings().scrape_interval_s,
                                        "/etc/prometheus/alerts.yml")
    config = yaml.safe_load(path.read_text())
    assert config == expected
    rules = DOCKER / "prometheus" / "alerts.yml"
    assert yaml.safe_load(rules.read_text()) == alerts.rules()
    # The rules file as the container sees it: here, at its path in the repository.
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump({**config, "rule_files": [str(rules)]}))
    out = subprocess.run([promtool, "check", "config", str(local)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    for compose in ("compose.cpu.yml", "compose.gpu.yml"):
        mounts = yaml.safe_load((DOCKER / compose).read_text())["services"]["prometheus"][
            "volumes"]
        assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts, compose


def grafana_dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DOCKER / "grafana" / "dashboards" / "pdctl.json")
                                     .read_text())
    return doc


def grafana_exprs() -> list[str]:
    return [t["expr"] for p in grafana_dashboard()["panels"] for t in p.get("targets", [])]


def test_grafana_provisioning_points_at_the_dashboard_and_datasource() -> None:
    prov = DOCKER / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert (source["type"], source["url"]) == ("prometheus", "${PROMETHEUS_URL}")
    interval = PrometheusSettings().scrape_interval_s
    assert source["jsonData"]["timeInterval"] == f"{interval:g}s" == "10s"  # the scrape interval
    # The console's shortest rate window is Grafana's $__rate_interval floor: 4 scrapes.
    assert prom.PROM_RATE_MIN_S == 4 * interval
    providers = yaml.safe_load((prov / "dashboards" / "pdctl.yml").read_text())["providers"]
    assert providers[0]["options"]["path"] == "/etc/grafana/dashboards"
    for name in COMPOSE_FILES:
        doc, _ = load_compose(name)
        vols = doc["services"]["grafana"]["volumes"]
        assert "./grafana/dashboards:/etc/grafana/dashboards:ro" in vols
        assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in vols
    dash = grafana_dashboard()
    assert dash["uid"] == "pdctl"
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(t["expr"] for t in panel["targets"])
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_grafana_has_every_console_panel_query() -> None:
    console = {prom.expr(name, "$__rate_interval") for name in prom.QUERIES}
    assert console - set(grafana_exprs()) == set()


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_every_image_is_built_here_or_named_by_a_knob(name: str) -> None:
    """Each service's image is either built by the file (with a Dockerfile here) or comes from
    a knob of docker/.env with the same default in the file; each build argument the file
    passes is one its Dockerfile declares, and every ``FROM`` names a declared argument or a
    build stage."""
    raw = yaml.safe_load((DOCKER / name).read_text())
    env = dotenv(DOCKER / ".env")
    for svc_name, svc in raw["services"].items():
        image = svc["image"]
        if "build" in svc:
            assert not VAR.search(image), f"{svc_name}: a built image has a fixed tag"
            dockerfile = (DOCKER / svc["build"]["context"] / svc["build"]["dockerfile"])
            text = dockerfile.read_text()
            args, _ = dockerfile_args_and_copies(dockerfile)
            stages = set(re.findall(r"^FROM \S+ AS (\S+)$", text, re.M))
            for base in re.findall(r"^FROM (\S+)", text, re.M):
                m = re.fullmatch(r"\$\{(\w+)\}", base)
                assert (m and m.group(1) in args) or base in stages or ":" in base, base
            for arg, value in svc["build"].get("args", {}).items():
                assert arg in args, f"{svc_name}: {arg} not declared in {dockerfile.name}"
                for m in VAR.finditer(str(value)):
                    assert m.group(1) in env, f"{svc_name}: {arg} uses an undefined knob"
        else:
            m = VAR.fullmatch(image)
            assert m and m.group(1) in env, f"{svc_name}: image {image} is not a knob"
            assert m.group(3) == env[m.group(1)], f"{svc_name}: default differs from .env"
    declared = set(raw.get("volumes") or {})
    used = {v.split(":")[0] for svc in raw["services"].values() for v in svc.get("volumes", [])
            if not v.startswith((".", "/", "$"))}
    assert used == declared, "a named volume is used but not declared, or declared unused"


def test_published_ports_listen_on_loopback_unless_changed() -> None:
    assert dotenv(DOCKER / ".env")["PUBLISH_ADDRESS"] == "127.0.0.1"
    for name in COMPOSE_FILES:
        doc, _ = load_compose(name)
        for svc in doc["services"].values():
            for port in svc.get("ports", []):
                assert port.startswith("127.0.0.1:"), port
