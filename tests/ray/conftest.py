"""A real local Ray cluster (``ray.cluster_utils.Cluster``: a head and worker raylets on this
machine, each worker offering ``accel`` units that stand for GPUs) and controllers on it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import in_private_netns
from tests.integration.harness import ControllerProc, start_controller

ACCEL = "accel"
PER_NODE = 4


class RayCluster:
    """The cluster, and this test process as a Ray driver in the namespace under test."""

    def __init__(self, workers: int, per_node: int = PER_NODE, head_cpus: int = 1) -> None:
        from ray.cluster_utils import Cluster

        # The head offers no accelerators: engines land on the workers only.
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": head_cpus, "include_dashboard": False})
        self.per_node = per_node
        self.workers = [self.add_node() for _ in range(workers)]
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address

    def add_node(self) -> Any:
        return self.cluster.add_node(num_cpus=8, resources={ACCEL: self.per_node})

    def connect(self, namespace: str) -> None:
        """This process as a driver in ``namespace`` (kept when it is one there already: a
        new driver would end what the old one owns, e.g. its placement groups)."""
        import ray

        if ray.is_initialized():
            if ray.get_runtime_context().namespace == namespace:
                return
            ray.shutdown()
        ray.init(address=self.address, namespace=namespace, log_to_driver=False,
                 logging_level="WARNING")

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()


def actors(namespace: str) -> list[str]:
    """Live named actors of ``namespace`` (this process connected there)."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == namespace)


def placement_groups() -> list[str]:
    """Names of the cluster's placement groups not removed."""
    from ray.util import placement_group_table

    return sorted(str(p.get("name")) for p in placement_group_table().values()
                  if p.get("state") != "REMOVED")


def _netns(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def engine_processes(marker: str = "controller.engines.sim") -> list[str]:
    """Engine processes running in this test's network namespace (other namespaces' engines,
    another run's, are not ours)."""
    here = _netns("self")
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if any(marker in c for c in cmd) and p.info["status"] != psutil.STATUS_ZOMBIE \
                and _netns(p.pid) == here:
            out.append(" ".join(cmd))
    return out


def ray_processes() -> list[str]:
    """Ray's own processes (GCS, raylets, workers) in this test's network namespace."""
    here = _netns("self")
    out = []
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if ("ray/core/src" in cmd or (p.info["name"] or "").startswith("ray::")
                or " ray start" in cmd) and p.info["status"] != psutil.STATUS_ZOMBIE \
                and _netns(p.pid) == here:
            out.append(cmd or str(p.info["name"]))
    return out


def ray_config(address: str, namespace: str, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "launcher": "ray",
        "model": {"name": "llama-3-8b"},
        "pools": {"prefill": {"size": 1, "tp": 1}, "decode": {"size": 1, "tp": 1}},
        "ray": {"address": address, "namespace": namespace, "accelerator_resource": ACCEL,
                "placement_timeout_s": 30},
        "controller": {"start_timeout_s": 90},
    }
    for key, value in extra.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


@pytest.fixture(autouse=True, scope="session")
def _private_network_namespace() -> None:
    """Named on the command line (``pytest tests/ray``) they are collected anywhere: refuse
    to run where Ray would bind the host's interface."""
    if not in_private_netns():
        pytest.fail("tests/ray must run in a private network namespace (as root: "
                    "`make test-ray`, or unshare -n sh -c 'ip link set lo up && pytest "
                    "tests/ray')", pytrace=False)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    c = RayCluster(workers=2)
    try:
        yield c
    finally:
        c.shutdown()


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    return f"t{os.getpid()}-{request.node.name[:40]}".replace("[", "-").replace("]", "")


@contextlib.contextmanager
def ray_controller(tmp: Path, cluster: RayCluster, namespace: str, wait_ready: bool = True,
                   **extra: Any) -> Iterator[ControllerProc]:
    """A ``pdctl controller`` on ``cluster`` in ``namespace`` (this process a driver there
    too), stopped at the end; then nothing of it may be left (``assert_nothing_left``)."""
    cluster.connect(namespace)
    ctl = start_controller(tmp, ray_config(cluster.address, namespace, **extra),
                           wait_ready=wait_ready)
    try:
        yield ctl
    finally:
        ctl.stop()
    assert_nothing_left(namespace)


def assert_nothing_left(namespace: str) -> None:
    """No actor of ``namespace``, no placement group of its instances, no engine process."""
    assert actors(namespace) == []
    assert [g for g in placement_groups() if g.startswith(("prefill-", "decode-"))] == []
    assert engine_processes() == []


def ps_tree() -> str:
    return subprocess.run(["ps", "-eo", "pid,pgid,stat,cmd"], capture_output=True,
                          text=True).stdout
