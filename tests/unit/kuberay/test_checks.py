"""Every check passes on docker/kuberay/'s manifests, and each fails on a manifest broken its
way (in memory), one mutation at least per check."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.unit.kuberay.cluster_checks import (
    check_crd_required,
    check_crd_types,
    check_head_is_ray,
    check_kinds,
    check_operator_rules,
    check_replicas,
    check_worker_gpus,
)
from tests.unit.kuberay.manifests import (
    CONFIG_KEY,
    GPU,
    RAY_TMP,
    Manifests,
    head_group,
    load,
    mount_at,
    pod_spec,
    raycluster,
    worker_groups,
)
from tests.unit.kuberay.pod_checks import (
    check_capacity,
    check_commands,
    check_config,
    check_image,
    check_kustomization,
    check_ports_unique,
    check_service,
    check_volumes,
)

CHECKS: list[Callable[[Manifests], None]] = [
    check_kinds, check_crd_required, check_crd_types, check_operator_rules, check_head_is_ray,
    check_worker_gpus, check_replicas, check_config, check_capacity, check_commands,
    check_ports_unique, check_volumes, check_service, check_kustomization, check_image,
]


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
