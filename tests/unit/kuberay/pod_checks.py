"""The checks of the pods as pdctl needs them: the ConfigMap's config, the pools' fit on the
workers, the containers' pdctl commands, the head pod's ports, the shared volumes, the
Service, the kustomization and the image. Each is a function of the loaded manifests that
raises AssertionError where they fail it."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import yaml

from controller.cli import console, serve
from tests.unit.kuberay.manifests import (
    COMPOSE_GPU,
    CONFIG_KEY,
    GPU,
    RAY_PORT_DEFAULTS,
    RAY_PORT_NAMES,
    RAY_TMP,
    Manifests,
    argv_of,
    head_group,
    kuberay_pod_labels,
    mount_at,
    parse_pdctl,
    pdctl_container,
    pod_spec,
    quantity,
    ray_param_ports,
    raycluster,
    settings_of,
    volume,
    volume_source,
    worker_groups,
)


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
    for kind, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        probe = c.get(kind, {}).get("httpGet", {})
        assert probe.get("path") == path, f"controller: {kind} is not {path}"
        assert probe.get("port") in (args.port, api[args.port].get("name")), \
            f"controller: {kind} port {probe.get('port')} is not --port {args.port}"
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
