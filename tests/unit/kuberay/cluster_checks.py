"""The checks of the RayCluster as KubeRay v1.7.0 reads it: each file's kind, the CRD's
required fields and types, the operator's rules, the head as the Ray head with no GPUs for
Ray, each worker group's Ray GPUs and its replicas. Each is a function of the loaded
manifests that raises AssertionError where they fail it."""

from __future__ import annotations

from tests.unit.kuberay.manifests import (
    CRD_POD_REQUIRED,
    CRD_REQUIRED,
    DNS1035,
    EXPECTED_KINDS,
    GPU,
    INT32_FIELDS,
    MAX_NAME,
    RAY_START_RESOURCE_PARAMS,
    Manifests,
    argv_of,
    head_group,
    nodes,
    pod_spec,
    raycluster,
    settings_of,
    worker_groups,
)


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
