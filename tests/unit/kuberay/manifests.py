"""docker/kuberay/'s manifests as the checks read them: the files, what is expected of them,
the KubeRay v1.7.0 facts (see the package's docstring for where they were read) and the
helpers that find the parts of a loaded manifest."""

from __future__ import annotations

import re
import tempfile
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from controller.cli import commands as cli
from controller.config import Settings, load_settings
from controller.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
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
