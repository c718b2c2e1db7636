"""docker/kuberay/ (docs/kuberay.md) checked without a Kubernetes cluster: every manifest
parses, the RayCluster has what the KubeRay CRD and operator require, the head offers Ray no
accelerators, every worker group's Ray GPUs are its pods' GPUs, the pdctl config in the
ConfigMap loads and fits the workers, the containers' pdctl commands parse with pdctl's own CLI
parser, the pods share the volumes the controller, the console and the engines need, the
Service reaches the head pod's ports, and the kustomization lists every manifest.

Each check is a function of the loaded manifests; ``test_check_catches`` breaks the manifests
one way per check (in memory) and expects that check to fail.

The KubeRay facts encoded here were read from KubeRay v1.7.0 (github.com/ray-project/kuberay,
tag ``v1.7.0``, commit 59d663aeec13760646da3db9c1cf8cfe883e30b7): the CRD
``ray-operator/config/crd/bases/ray.io_rayclusters.yaml`` (schema of version ``v1``), the
operator's ``ray-operator/controllers/ray/utils/validation.go`` and
``ray-operator/controllers/ray/common/pod.go``. Nothing of them is copied into this repository.
"""

from __future__ import annotations

import copy
import os
import re
import tempfile
import tomllib
from argparse import Namespace
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from controller.cli import commands as cli
from controller.cli import console, serve
from controller.config import Settings, load_settings
from controller.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
KUBERAY = ROOT / "docker" / "kuberay"
COMPOSE_GPU = ROOT / "docker" / "compose.gpu.yml"
DOCKERFILE_GPU = ROOT / "docker" / "Dockerfile.gpu"

EXPECTED_KINDS = {
    "raycluster.yaml": ("ray.io/v1", "RayCluster"),
    "pdctl-config.yaml": ("v1", "ConfigMap"),
    "service.yaml": ("v1", "Service"),
    "kustomization.yaml": ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
}
CONFIG_KEY = "pdctl.yaml"  # the ConfigMap's key that holds the pdctl config
GPU = "nvidia.com/gpu"

# ---- KubeRay v1.7.0 facts ---------------------------------------------------------------------
# `required:` lists of ray.io_rayclusters.yaml (v1 schema) on the paths these manifests use.
CRD_REQUIRED = {
    "spec": ["headGroupSpec"],
    "spec.headGroupSpec": ["template"],
    "spec.workerGroupSpecs[]": ["groupName", "maxReplicas", "minReplicas", "template"],
}
# ... and under every pod template (headGroupSpec.template, workerGroupSpecs[].template).
CRD_POD_REQUIRED = {
    "spec": ["containers"],
    "spec.containers[]": ["name"],
    "spec.containers[].ports[]": ["containerPort"],
    "spec.containers[].env[]": ["name"],
    "spec.containers[].volumeMounts[]": ["mountPath", "name"],
    "spec.containers[].readinessProbe.httpGet": ["port"],
    "spec.containers[].livenessProbe.httpGet": ["port"],
    "spec.containers[].startupProbe.httpGet": ["port"],
    "spec.volumes[]": ["name"],
    "spec.volumes[].configMap.items[]": ["key", "path"],
    "spec.volumes[].persistentVolumeClaim": ["claimName"],
}
# The CRD's types: rayStartParams is {type: object, additionalProperties: {type: string}};
# replicas, minReplicas, maxReplicas and numOfHosts are int32; containers is a list-map keyed
# by name (names unique in a pod).
INT32_FIELDS = ("replicas", "minReplicas", "maxReplicas", "numOfHosts")
# validation.go: a RayCluster name is a DNS-1035 label of at most 53 characters;
# rayStartParams' resource fields and the group's top-level `resources` exclude each other;
# rayStartParams may not hold `labels`.
MAX_NAME = 53
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
RAY_START_RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")
# constant.go: the Ray container is the first one of a pod (RayContainerIndex = 0); the ports
# Ray listens on unless rayStartParams says otherwise (pod.go setMissingRayStartParams adds
# metrics-export-port=8080 and dashboard-agent-listen-port=52365); and if the Ray container
# declares no port named "metrics", pod.go adds one at 8080.
RAY_PORT_DEFAULTS = {"port": 6379, "dashboard-port": 8265, "ray-client-server-port": 10001,
                     "metrics-export-port": 8080, "dashboard-agent-listen-port": 52365}
RAY_PORT_NAMES = {"gcs-server": "port", "dashboard": "dashboard-port",
                  "client": "ray-client-server-port", "metrics": "metrics-export-port"}
RAY_TMP = "/tmp/ray"  # Ray's default temp dir (sockets of the raylet a driver joins)


def kuberay_pod_labels(cluster: str, node_type: str, group: str,
                       template_labels: dict[str, str]) -> dict[str, str]:
    """The labels KubeRay gives a pod (pod.go labelPod): the template's, over its own defaults,
    except that ray.io/cluster, ray.io/node-type and ray.io/group are always its own."""
    own = {"ray.io/cluster": cluster, "ray.io/node-type": node_type, "ray.io/group": group}
    defaults = {"ray.io/is-ray-node": "yes", "app.kubernetes.io/name": "kuberay",
                "app.kubernetes.io/created-by": "kuberay-operator"}
    return {**defaults, **template_labels, **own}


# ---- loading ----------------------------------------------------------------------------------

Manifests = dict[str, Any]  # file name -> its one YAML document


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBERAY.iterdir() if p.suffix in (".yaml", ".yml"))


def parse_one(text: str, name: str) -> Any:
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert len(docs) == 1, f"{name}: {len(docs)} YAML documents, expected one"
    return docs[0]


def load() -> Manifests:
    return {p.name: parse_one(p.read_text(), p.name) for p in manifest_files()}


def raycluster(m: Manifests) -> dict[str, Any]:
    rc: dict[str, Any] = m["raycluster.yaml"]
    return rc


def head_group(m: Manifests) -> dict[str, Any]:
    head: dict[str, Any] = raycluster(m)["spec"]["headGroupSpec"]
    return head


def worker_groups(m: Manifests) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = raycluster(m)["spec"].get("workerGroupSpecs") or []
    return groups


def pod_spec(group: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = group["template"]["spec"]
    return spec


def argv_of(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def parse_pdctl(argv: list[str]) -> Namespace:
    """``argv`` as pdctl's own CLI parser reads it; AssertionError where it refuses."""
    assert argv and argv[0] == "pdctl", f"not a pdctl command: {argv}"
    try:
        return cli.build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        raise AssertionError(f"pdctl's parser refuses {argv}") from exc


def pdctl_container(m: Manifests, verb: str) -> tuple[dict[str, Any], Namespace]:
    """The one head-pod container that runs ``pdctl VERB``, and its parsed arguments."""
    found = []
    for c in pod_spec(head_group(m))["containers"]:
        argv = argv_of(c)
        if argv[:1] == ["pdctl"] and argv[1:2] == [verb]:
            found.append((c, parse_pdctl(argv)))
    assert len(found) == 1, f"{len(found)} head containers run `pdctl {verb}`, expected 1"
    return found[0]


def settings_of(m: Manifests) -> Settings:
    """The ConfigMap's pdctl config, loaded the way the controller loads its --config."""
    text = m["pdctl-config.yaml"]["data"][CONFIG_KEY]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / CONFIG_KEY
        path.write_text(text)
        try:
            return load_settings(path)
        except ConfigError as exc:
            raise AssertionError(f"the ConfigMap's pdctl config does not load: {exc}") from exc


def mount_at(container: dict[str, Any], path: str) -> dict[str, Any] | None:
    for vm in container.get("volumeMounts", []):
        if vm["mountPath"].rstrip("/") == str(path).rstrip("/"):
            mount: dict[str, Any] = vm
            return mount
    return None


def volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    vols = [v for v in pod.get("volumes", []) if v["name"] == name]
    assert len(vols) == 1, f"{len(vols)} pod volumes named {name!r}"
    return vols[0]


def volume_source(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in volume(pod, name).items() if k != "name"}


def ray_param_ports(params: dict[str, str]) -> dict[str, int]:
    return {k: int(params.get(k, d)) for k, d in RAY_PORT_DEFAULTS.items()}


def quantity(value: Any) -> float:
    """A Kubernetes CPU quantity ("48", 48, "500m") in cores."""
    s = str(value)
    return float(s[:-1]) / 1000 if s.endswith("m") else float(s)


def nodes(obj: Any, path: str) -> Iterator[Any]:
    """The values at a dotted ``path`` (``x[]`` walks the list x); missing parts yield none."""
    if not path:
        yield obj
        return
    head, _, rest = path.partition(".")
    many = head.endswith("[]")
    key = head[:-2] if many else head
    if not isinstance(obj, dict) or key not in obj:
        return
    value = obj[key]
    for item in (value if many else [value]):
        if many:
            assert isinstance(item, dict), f"{path}: list items must be mappings"
        yield from nodes(item, rest)


# ---- the checks ---------------------------------------------------------------------------


def check_kinds(m: Manifests) -> None:
    """Each file holds the kind it is named for, at the expected apiVersion, with a name."""
    assert set(m) == set(EXPECTED_KINDS), f"files {sorted(m)}, expected {sorted(EXPECTED_KINDS)}"
    for name, (api, kind) in EXPECTED_KINDS.items():
        doc = m[name]
        assert isinstance(doc, dict), f"{name}: not a mapping"
        assert (doc.get("apiVersion"), doc.get("kind")) == (api, kind), \
            f"{name}: {doc.get('apiVersion')}/{doc.get('kind')}, expected {api}/{kind}"
        if kind != "Kustomization":
            assert doc.get("metadata", {}).get("name"), f"{name}: no metadata.name"
    assert isinstance(raycluster(m).get("spec"), dict), "RayCluster without spec"


def check_crd_required(m: Manifests) -> None:
    """The fields the KubeRay v1.7.0 CRD requires, and what Kubernetes needs of a container."""
    rc = raycluster(m)
    for path, keys in CRD_REQUIRED.items():
        for node in nodes(rc, path):
            for key in keys:
                assert key in node, f"RayCluster {path}: {key} is required (KubeRay CRD)"
    templates = [head_group(m).get("template")] + [g.get("template") for g in worker_groups(m)]
    for t in templates:
        for path, keys in CRD_POD_REQUIRED.items():
            for node in nodes(t, path):
                for key in keys:
                    assert key in node, f"pod template {path}: {key} is required (KubeRay CRD)"
        for c in nodes(t, "spec.containers[]"):
            assert c.get("image"), f"container {c.get('name')}: no image"


def check_crd_types(m: Manifests) -> None:
    """rayStartParams maps to strings, replica counts are int32, container names unique."""
    groups = [("head", head_group(m))] + [(g.get("groupName"), g) for g in worker_groups(m)]
    for name, g in groups:
        params = g.get("rayStartParams", {})
        assert isinstance(params, dict), f"group {name}: rayStartParams is not a mapping"
        for k, v in params.items():
            assert isinstance(v, str), \
                f"group {name}: rayStartParams[{k!r}] = {v!r} must be a string (KubeRay CRD)"
        for field in INT32_FIELDS:
            if field in g:
                v = g[field]
                assert isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31, \
                    f"group {name}: {field} = {v!r} is not an int32"
        names = [c["name"] for c in pod_spec(g)["containers"]]
        assert len(names) == len(set(names)), f"group {name}: container names repeat {names}"
    group_names = [g["groupName"] for g in worker_groups(m)]
    assert len(group_names) == len(set(group_names)), f"worker groups repeat: {group_names}"


def check_operator_rules(m: Manifests) -> None:
    """What KubeRay v1.7.0's validation.go refuses."""
    name = raycluster(m)["metadata"]["name"]
    assert len(name) <= MAX_NAME and DNS1035.match(name), \
        f"RayCluster name {name!r}: not a DNS-1035 label of <= {MAX_NAME} characters"
    groups = [("head", head_group(m))] + [(g["groupName"], g) for g in worker_groups(m)]
    for gname, g in groups:
        params = g.get("rayStartParams", {})
        assert pod_spec(g).get("containers"), f"group {gname}: no container"
        assert not (any(params.get(k) for k in RAY_START_RESOURCE_PARAMS) and g.get("resources")), \
            f"group {gname}: resources in both rayStartParams and the group's resources"
        assert "labels" not in params, f"group {gname}: rayStartParams['labels'] not supported"
    for g in worker_groups(m):
        assert 0 <= g["minReplicas"] <= g["maxReplicas"], \
            f"group {g['groupName']}: minReplicas {g['minReplicas']} > maxReplicas"


def check_head_is_ray(m: Manifests) -> None:
    """The head's first container is the Ray head (KubeRay runs `ray start --head` in it); the
    head offers Ray no accelerator, so no engine actor lands there."""
    head = head_group(m)
    first = pod_spec(head)["containers"][0]
    argv = argv_of(first)
    assert not argv or any("ray start" in a for a in argv), \
        f"head's first container {first['name']} runs {argv}, not the Ray head"
    ports = {p.get("name"): p["containerPort"] for p in first.get("ports", [])}
    assert "gcs-server" in ports, f"head's first container {first['name']}: no gcs-server port"
    settings = settings_of(m)
    assert settings.ray_accelerator == "GPU", "these manifests give Ray GPUs"
    assert head.get("rayStartParams", {}).get("num-gpus") == "0", \
        "head rayStartParams must set num-gpus: \"0\" (else Ray counts the head's GPUs)"
    for c in pod_spec(head)["containers"]:
        res = c.get("resources", {})
        for kind in ("limits", "requests"):
            assert GPU not in res.get(kind, {}), f"head container {c['name']} asks for GPUs"


def check_worker_gpus(m: Manifests) -> None:
    """Each worker group's Ray GPUs equal its Ray container's nvidia.com/gpu limit (and the
    config's accelerators_per_node)."""
    assert worker_groups(m), "no worker group: the engines need GPU workers"
    per_node = settings_of(m).hardware.per_node
    for g in worker_groups(m):
        ray_c = pod_spec(g)["containers"][0]
        res = ray_c.get("resources", {})
        limit = res.get("limits", {}).get(GPU)
        assert limit is not None and int(limit) > 0, \
            f"group {g['groupName']}: Ray container has no {GPU} limit"
        if GPU in res.get("requests", {}):
            assert int(res["requests"][GPU]) == int(limit), \
                f"group {g['groupName']}: {GPU} request != limit"
        param = g.get("rayStartParams", {}).get("num-gpus")
        assert param == str(int(limit)), \
            f"group {g['groupName']}: rayStartParams num-gpus {param!r} != {GPU} limit {limit}"
        assert int(limit) == per_node, \
            f"group {g['groupName']}: {limit} GPUs, config accelerators_per_node {per_node}"


def check_replicas(m: Manifests) -> None:
    for g in worker_groups(m):
        lo, n, hi = g["minReplicas"], g.get("replicas", g["minReplicas"]), g["maxReplicas"]
        assert lo <= n <= hi, \
            f"group {g['groupName']}: minReplicas {lo} <= replicas {n} <= maxReplicas {hi} fails"


def check_config(m: Manifests) -> None:
    """The ConfigMap's config loads with launcher ray and joins the head in its own pod, and it
    is what the controller's --config reads."""
    settings = settings_of(m)
    assert settings.launcher == "ray", f"launcher {settings.launcher}, expected ray"
    assert settings.backend == "vllm", f"backend {settings.backend}, expected vllm"
    address = settings.ray.address or ""
    host, _, port = address.rpartition(":")
    gcs = ray_param_ports(head_group(m).get("rayStartParams", {}))["port"]
    assert host in ("127.0.0.1", "localhost") and port == str(gcs), \
        f"ray.address {address!r}: the controller runs in the head pod, Ray's GCS on :{gcs}"
    c, args = pdctl_container(m, "controller")
    config = Path(args.config)
    mount = mount_at(c, str(config.parent))
    assert mount is not None, f"controller: nothing mounted at {config.parent}"
    cm = volume(pod_spec(head_group(m)), mount["name"]).get("configMap")
    assert cm and cm["name"] == m["pdctl-config.yaml"]["metadata"]["name"], \
        f"controller: {config.parent} is not the pdctl ConfigMap"
    items = {i["path"]: i["key"] for i in cm.get("items", [])} or {CONFIG_KEY: CONFIG_KEY}
    assert items.get(config.name) == CONFIG_KEY, \
        f"controller: --config {config} is not the ConfigMap's {CONFIG_KEY}"


def check_capacity(m: Manifests) -> None:
    """The pools fit the workers: each TP group on one worker, all of them on the replicas'
    GPUs, and a worker full of the smallest instances has the Ray CPUs they reserve."""
    s = settings_of(m)
    pools = [s.pools.prefill, s.pools.decode]
    demand = sum(p.size * p.tp for p in pools)
    gpus_total = 0
    for g in worker_groups(m):
        ray_c = pod_spec(g)["containers"][0]
        gpus = int(ray_c["resources"]["limits"][GPU])
        gpus_total += gpus * g.get("replicas", g["minReplicas"])
        for p in pools:
            assert p.tp <= gpus, f"group {g['groupName']}: TP {p.tp} > its {gpus} GPUs"
        params, res = g.get("rayStartParams", {}), ray_c.get("resources", {})
        cpu = params.get("num-cpus") or res.get("limits", {}).get("cpu") \
            or res.get("requests", {}).get("cpu")
        assert cpu is not None, f"group {g['groupName']}: Ray's CPUs unknown"
        engines = gpus // min(p.tp for p in pools)
        need = engines * s.ray.engine_cpus
        assert need <= quantity(cpu), (f"group {g['groupName']}: {engines} engines x "
                                       f"{s.ray.engine_cpus} CPUs > its {cpu} Ray CPUs")
        if "num-cpus" in params and res.get("limits", {}).get("cpu"):
            assert quantity(params["num-cpus"]) <= quantity(res["limits"]["cpu"]), \
                f"group {g['groupName']}: num-cpus above the container's CPU limit"
    assert demand <= gpus_total, f"pools need {demand} GPUs, the worker replicas have {gpus_total}"


def check_commands(m: Manifests) -> None:
    """The controller and console commands parse with pdctl's parser and agree with the pod."""
    c, args = pdctl_container(m, "controller")
    assert args.run is serve.run_controller
    api = {p["containerPort"]: p for p in c.get("ports", [])}
    assert args.port in api, f"controller --port {args.port} is not a containerPort {list(api)}"
    assert args.host == "0.0.0.0", f"controller --host {args.host}: the Service needs 0.0.0.0"
    probe = c.get("readinessProbe", {}).get("httpGet", {})
    assert probe.get("path") == "/healthz", "controller: readiness probe is not /healthz"
    assert probe.get("port") in (args.port, api[args.port].get("name")), \
        f"controller: readiness probe port {probe.get('port')} is not --port {args.port}"
    settings = settings_of(m)
    assert Path(args.state_dir) == settings.controller.state_dir, \
        "controller --state-dir differs from the config's controller.state_dir"

    d, dargs = pdctl_container(m, "dashboard")
    assert dargs.run is console.run_dashboard
    assert dargs.port in {p["containerPort"] for p in d.get("ports", [])}, \
        f"console --port {dargs.port} is not a containerPort"
    assert dargs.host == "0.0.0.0", f"console --host {dargs.host}: the Service needs 0.0.0.0"
    url = urlsplit(dargs.controller)
    assert url.hostname in ("127.0.0.1", "localhost") and url.port == args.port, \
        f"console --controller {dargs.controller}: the controller is on :{args.port} in this pod"
    assert Path(dargs.state_dir) == Path(args.state_dir), \
        "console --state-dir differs from the controller's (the token is there)"


def check_ports_unique(m: Manifests) -> None:
    """No two processes of the head pod (one network namespace) on one port, counting the
    ports Ray opens by default; the Ray container declares the ports Ray really uses."""
    head = pod_spec(head_group(m))
    params = head_group(m).get("rayStartParams", {})
    ray_ports = ray_param_ports(params)
    first = head["containers"][0]
    declared = {p.get("name"): p["containerPort"] for p in first.get("ports", [])}
    declared.setdefault("metrics", RAY_PORT_DEFAULTS["metrics-export-port"])  # pod.go adds it
    for pname, key in RAY_PORT_NAMES.items():
        if pname in declared:
            assert declared[pname] == ray_ports[key], \
                f"Ray container port {pname}={declared[pname]}, but Ray's {key} is {ray_ports[key]}"
    owners: dict[int, str] = {port: f"ray {key}" for key, port in ray_ports.items()}
    for port in declared.values():
        owners.setdefault(port, "ray")
    for c in head["containers"][1:]:
        ports = {p["containerPort"] for p in c.get("ports", [])}
        argv = argv_of(c)
        if argv[:1] == ["pdctl"]:
            ports.add(parse_pdctl(argv).port)
        for port in ports:
            assert port not in owners, \
                f"head pod: port {port} of {c['name']} is taken by {owners[port]}"
            owners[port] = c["name"]


def check_volumes(m: Manifests) -> None:
    """The controller joins Ray through the head's /tmp/ray; controller and console share the
    state dir; the model is mounted read-only at model.path wherever pdctl or an engine runs;
    workers have memory-backed /dev/shm and a writable state-dir path for engine logs."""
    settings = settings_of(m)
    head = pod_spec(head_group(m))
    ray_head = head["containers"][0]
    c, args = pdctl_container(m, "controller")
    d, dargs = pdctl_container(m, "dashboard")
    tmp = head_group(m).get("rayStartParams", {}).get("temp-dir", RAY_TMP)
    ray_tmp, ctl_tmp = mount_at(ray_head, tmp), mount_at(c, tmp)
    assert ray_tmp and ctl_tmp and ray_tmp["name"] == ctl_tmp["name"], \
        f"controller and Ray head do not share {tmp} (the raylet's sockets)"

    state, dstate = mount_at(c, args.state_dir), mount_at(d, dargs.state_dir)
    assert state and not state.get("readOnly"), "controller: state dir not a writable volume"
    assert dstate and dstate["name"] == state["name"], \
        "console does not mount the controller's state volume"

    assert settings.model.path is not None, "config has no model.path"
    model = str(settings.model.path)
    sources = []
    pods = [(head, [ray_head, c])] + [(pod_spec(g), [pod_spec(g)["containers"][0]])
                                      for g in worker_groups(m)]
    for pod, containers in pods:
        for ctr in containers:
            mount = mount_at(ctr, model)
            assert mount is not None, f"{ctr['name']}: model.path {model} not mounted"
            assert mount.get("readOnly") is True, f"{ctr['name']}: model mounted writable"
            sources.append(volume_source(pod, mount["name"]))
    assert all(s == sources[0] for s in sources), "the model volume differs between pods"

    for g in worker_groups(m):
        pod = pod_spec(g)
        ray_c = pod["containers"][0]
        shm = mount_at(ray_c, "/dev/shm")
        assert shm and volume_source(pod, shm["name"]).get("emptyDir", {}).get("medium") \
            == "Memory", f"group {g['groupName']}: no memory-backed /dev/shm"
        logs = mount_at(ray_c, args.state_dir)
        assert logs and not logs.get("readOnly"), \
            f"group {g['groupName']}: engines write logs under {args.state_dir}: not writable"


def check_service(m: Manifests) -> None:
    """The Service selects the head pod (not a worker) and reaches the controller and console
    ports of its containers."""
    svc = m["service.yaml"]["spec"]
    rc = raycluster(m)
    name = rc["metadata"]["name"]
    head_tmpl = head_group(m)["template"]
    head_labels = kuberay_pod_labels(name, "head", "headgroup",
                                     head_tmpl.get("metadata", {}).get("labels", {}))
    selector = svc.get("selector") or {}
    assert selector, "Service without selector"
    assert selector.items() <= head_labels.items(), \
        f"Service selector {selector} does not match the head pod's labels {head_labels}"
    for g in worker_groups(m):
        labels = kuberay_pod_labels(name, "worker", g["groupName"],
                                    g["template"].get("metadata", {}).get("labels", {}))
        assert not selector.items() <= labels.items(), \
            f"Service selector also matches worker group {g['groupName']}"
    by_name: dict[str, int] = {}
    numbers: set[int] = set()
    for c in pod_spec(head_group(m))["containers"]:
        for p in c.get("ports", []):
            numbers.add(p["containerPort"])
            if "name" in p:
                by_name[p["name"]] = p["containerPort"]
    reached: set[int] = set()
    for p in svc.get("ports", []):
        target = p.get("targetPort", p["port"])
        port = by_name.get(target) if isinstance(target, str) else target
        assert port is not None and port in numbers, \
            f"Service port {p.get('name')}: targetPort {target} not in the pod"
        reached.add(port)
    _, args = pdctl_container(m, "controller")
    _, dargs = pdctl_container(m, "dashboard")
    assert {args.port, dargs.port} <= reached, \
        f"Service reaches {sorted(reached)}, not controller :{args.port} and console :{dargs.port}"


def check_kustomization(m: Manifests) -> None:
    """kustomization.yaml lists every manifest of the folder, and its image rule names the
    image the containers use."""
    k = m["kustomization.yaml"]
    listed = list(k.get("resources", []))
    files = sorted(n for n in m if n != "kustomization.yaml")
    assert sorted(listed) == files, f"kustomization resources {listed}, folder has {files}"
    images = {c["image"].rpartition(":")[0] or c["image"]
              for g in [head_group(m), *worker_groups(m)] for c in pod_spec(g)["containers"]}
    rules = {i["name"] for i in k.get("images", [])}
    assert images <= rules, f"kustomization images {rules} do not cover {images}"


def gpu_image() -> str:
    """The image docker/compose.gpu.yml builds from docker/Dockerfile.gpu."""
    compose = yaml.safe_load(COMPOSE_GPU.read_text())
    for svc in compose["services"].values():
        if svc.get("build", {}).get("dockerfile") == "docker/Dockerfile.gpu":
            image: str = svc["image"]
            return image
    raise AssertionError("compose.gpu.yml builds no image from docker/Dockerfile.gpu")


def check_image(m: Manifests) -> None:
    """Every container runs the GPU image (Ray, pdctl and vLLM at one version everywhere)."""
    want = gpu_image()
    for g in [head_group(m), *worker_groups(m)]:
        for c in pod_spec(g)["containers"]:
            assert c["image"] == want, f"container {c['name']}: image {c['image']}, not {want}"


CHECKS: list[Callable[[Manifests], None]] = [
    check_kinds, check_crd_required, check_crd_types, check_operator_rules, check_head_is_ray,
    check_worker_gpus, check_replicas, check_config, check_capacity, check_commands,
    check_ports_unique, check_volumes, check_service, check_kustomization, check_image,
]


@pytest.fixture(autouse=True)
def _no_pdctl_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The config is checked as the file says, not as this shell's PDCTL_* would change it."""
    for key in list(os.environ):
        if key.startswith("PDCTL_"):
            monkeypatch.delenv(key)


def test_every_file_parses_as_one_yaml_document() -> None:
    files = manifest_files()
    assert {p.name for p in files} == set(EXPECTED_KINDS)
    for p in files:
        assert isinstance(parse_one(p.read_text(), p.name), dict)


def test_a_broken_file_is_caught() -> None:
    with pytest.raises(yaml.YAMLError):
        parse_one("kind: Service\nspec: {ports: [\n", "broken.yaml")
    with pytest.raises(AssertionError):
        parse_one("kind: A\n---\nkind: B\n", "two.yaml")


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_manifests(check: Callable[[Manifests], None]) -> None:
    check(load())


# ---- each check fails on a manifest broken its way ----------------------------------------

def _head_c(m: Manifests, i: int) -> dict[str, Any]:
    c: dict[str, Any] = pod_spec(head_group(m))["containers"][i]
    return c


def _worker(m: Manifests) -> dict[str, Any]:
    return worker_groups(m)[0]


def _set_config(m: Manifests, edit: Callable[[dict[str, Any]], None]) -> None:
    cfg = yaml.safe_load(m["pdctl-config.yaml"]["data"][CONFIG_KEY])
    edit(cfg)
    m["pdctl-config.yaml"]["data"][CONFIG_KEY] = yaml.safe_dump(cfg)


def _set_flag(c: dict[str, Any], flag: str, value: str) -> None:
    c["command"] = [a if not a.startswith(f"{flag}=") else f"{flag}={value}"
                    for a in c["command"]]


def _rename_flag(c: dict[str, Any], old: str, new: str) -> None:
    c["command"] = [a.replace(old, new, 1) if a.startswith(old) else a for a in c["command"]]


def _mount_path(c: dict[str, Any], path: str) -> dict[str, Any]:
    mount = mount_at(c, path)
    assert mount is not None
    return mount


def _set_worker_gpus(m: Manifests, pod_gpus: int, ray_gpus: str) -> None:
    res = _worker(m)["template"]["spec"]["containers"][0]["resources"]
    res["limits"][GPU] = res["requests"][GPU] = pod_gpus
    _worker(m)["rayStartParams"]["num-gpus"] = ray_gpus


def _tp_above_worker(m: Manifests) -> None:
    _set_worker_gpus(m, 2, "2")
    _set_config(m, lambda c: c["pools"].update(prefill={"size": 1, "tp": 4},
                                               decode={"size": 1, "tp": 4}))


def _ray_metrics_default(m: Manifests) -> None:
    """Ray's metrics port left to KubeRay's default (8080, the controller's)."""
    head_group(m)["rayStartParams"].pop("metrics-export-port")
    ray_head = _head_c(m, 0)
    ray_head["ports"] = [p for p in ray_head["ports"] if p["name"] != "metrics"]


def _drop_mount(c: dict[str, Any], path: str) -> None:
    c["volumeMounts"] = [v for v in c["volumeMounts"] if v["mountPath"] != path]


MUTATIONS: dict[str, tuple[Callable[[Manifests], None], Callable[[Manifests], object]]] = {
    "raycluster-apiversion": (check_kinds, lambda m: raycluster(m).update(apiVersion="ray.io/v2")),
    "service-kind": (check_kinds, lambda m: m["service.yaml"].update(kind="Deployment")),
    "no-minreplicas": (check_crd_required, lambda m: _worker(m).pop("minReplicas")),
    "no-head-template": (check_crd_required, lambda m: head_group(m).pop("template")),
    "container-without-name": (check_crd_required, lambda m: _head_c(m, 1).pop("name")),
    "mount-without-path": (check_crd_required,
                           lambda m: _head_c(m, 1)["volumeMounts"][0].pop("mountPath")),
    "no-image": (check_crd_required, lambda m: _worker(m)["template"]["spec"]["containers"][0]
                 .pop("image")),
    "int-ray-start-param": (check_crd_types,
                            lambda m: _worker(m)["rayStartParams"].update({"num-gpus": 8})),
    "string-replicas": (check_crd_types, lambda m: _worker(m).update(replicas="1")),
    "same-container-names": (check_crd_types,
                             lambda m: _head_c(m, 2).update(name=_head_c(m, 1)["name"])),
    "bad-cluster-name": (check_operator_rules,
                         lambda m: raycluster(m)["metadata"].update(name="pdctl_ray")),
    "long-cluster-name": (check_operator_rules,
                          lambda m: raycluster(m)["metadata"].update(name="p" * 54)),
    "both-resource-forms": (check_operator_rules,
                            lambda m: _worker(m).update(resources={"GPU": "8"})),
    "ray-start-labels": (check_operator_rules,
                         lambda m: _worker(m)["rayStartParams"].update(labels="a=b")),
    "min-above-max": (check_operator_rules, lambda m: _worker(m).update(minReplicas=5)),
    "controller-first": (check_head_is_ray,
                         lambda m: pod_spec(head_group(m))["containers"].reverse()),
    "head-offers-gpus": (check_head_is_ray,
                         lambda m: head_group(m)["rayStartParams"].pop("num-gpus")),
    "head-container-gpus": (check_head_is_ray, lambda m: _head_c(m, 1)["resources"]["limits"]
                            .update({GPU: 1})),
    "ray-gpus-not-limit": (check_worker_gpus,
                           lambda m: _worker(m)["rayStartParams"].update({"num-gpus": "4"})),
    "gpu-limit-not-ray-gpus": (check_worker_gpus, lambda m: _set_worker_gpus(m, 4, "8")),
    "gpus-not-per-node": (check_worker_gpus, lambda m: _set_config(
        m, lambda c: c["hardware"].update(accelerators_per_node=4))),
    "replicas-above-max": (check_replicas, lambda m: _worker(m).update(replicas=5)),
    "replicas-below-min": (check_replicas, lambda m: _worker(m).update(minReplicas=1,
                                                                        replicas=0)),
    "launcher-local": (check_config, lambda m: _set_config(
        m, lambda c: c.update(launcher="local"))),
    "unknown-config-key": (check_config, lambda m: _set_config(
        m, lambda c: c["ray"].update(adress="x"))),
    "ray-address-port": (check_config, lambda m: _set_config(
        m, lambda c: c["ray"].update(address="127.0.0.1:6380"))),
    "config-path": (check_config, lambda m: _set_flag(_head_c(m, 1), "--config",
                                                      "/etc/pdctl/other.yaml")),
    "tp-above-worker": (check_capacity, lambda m: _tp_above_worker(m)),
    "pools-above-gpus": (check_capacity, lambda m: _set_config(
        m, lambda c: c["pools"]["decode"].update(size=7))),
    "engine-cpus": (check_capacity, lambda m: _set_config(
        m, lambda c: c["ray"].update(engine_cpus=8))),
    "renamed-flag": (check_commands, lambda m: _rename_flag(_head_c(m, 1), "--state-dir",
                                                            "--state_dir")),
    "unknown-verb": (check_commands, lambda m: _head_c(m, 2)["command"].__setitem__(1, "console")),
    "controller-port": (check_commands, lambda m: _set_flag(_head_c(m, 1), "--port", "9000")),
    "console-controller-url": (check_commands, lambda m: _set_flag(
        _head_c(m, 2), "--controller", "http://127.0.0.1:9000")),
    "probe-path": (check_commands, lambda m: _head_c(m, 1)["readinessProbe"]["httpGet"]
                   .update(path="/health")),
    "ray-metrics-on-8080": (check_ports_unique, lambda m: _ray_metrics_default(m)),
    "ray-port-declared-wrong": (check_ports_unique, lambda m: head_group(m)["rayStartParams"]
                                .update({"metrics-export-port": "8082"})),
    "console-on-dashboard-port": (check_ports_unique, lambda m: _set_flag(
        _head_c(m, 2), "--port", "8265")),
    "no-shared-ray-tmp": (check_volumes, lambda m: _drop_mount(_head_c(m, 1), RAY_TMP)),
    "model-writable": (check_volumes, lambda m: _mount_path(
        _worker(m)["template"]["spec"]["containers"][0], "/models/model").update(readOnly=False)),
    "model-elsewhere": (check_volumes, lambda m: _mount_path(
        _worker(m)["template"]["spec"]["containers"][0], "/models/model").update(
            mountPath="/models/other")),
    "console-own-state": (check_volumes, lambda m: _mount_path(
        _head_c(m, 2), "/var/lib/pdctl").update(name="ray-tmp")),
    "no-worker-shm": (check_volumes,
                      lambda m: _drop_mount(_worker(m)["template"]["spec"]["containers"][0],
                                            "/dev/shm")),
    "selector-workers": (check_service, lambda m: m["service.yaml"]["spec"]["selector"]
                         .update({"ray.io/node-type": "worker"})),
    "selector-any-node": (check_service, lambda m: m["service.yaml"]["spec"]["selector"]
                          .pop("ray.io/node-type")),
    "target-port-name": (check_service, lambda m: m["service.yaml"]["spec"]["ports"][0]
                         .update(targetPort="apix")),
    "no-console-port": (check_service, lambda m: m["service.yaml"]["spec"]["ports"].pop()),
    "unlisted-manifest": (check_kustomization,
                          lambda m: m["kustomization.yaml"]["resources"].remove("service.yaml")),
    "image-rule-name": (check_kustomization,
                        lambda m: m["kustomization.yaml"]["images"][0].update(name="pdctl-gpu")),
    "other-image": (check_image, lambda m: _head_c(m, 2).update(image="pdctl:console")),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_check_catches(case: str) -> None:
    check, mutate = MUTATIONS[case]
    m = copy.deepcopy(load())
    mutate(m)
    with pytest.raises(AssertionError):
        check(m)


def test_every_check_is_exercised_by_a_mutation() -> None:
    assert {c for c, _ in MUTATIONS.values()} == set(CHECKS)


# ---- beyond the manifests --------------------------------------------------------------------

def test_ray_version_is_the_images() -> None:
    """The RayCluster's rayVersion (KubeRay picks its probes by it) is the Ray the GPU image
    installs: pdctl's ``ray`` extra, pinned in pyproject.toml."""
    assert re.search(r"pip install[^\n]*\.\[ray\]", DOCKERFILE_GPU.read_text())
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["ray"]
    pin = next(re.fullmatch(r"ray(?:\[[^\]]*\])?==([0-9.]+)", d) for d in extra
               if d.startswith("ray"))
    assert pin is not None
    assert raycluster(load())["spec"].get("rayVersion") == pin.group(1)
