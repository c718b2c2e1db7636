"""The Ray launcher's pure parts: bundles, actor options, cluster capacity, the local head's
command line, device choice on a node, and the settings that select it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from controller.config import load_settings
from controller.errors import ConfigError, InvalidChange
from controller.launchers.base import LaunchSpec
from controller.launchers.ray import ClusterView, actor_options, bundle, died_reason
from controller.launchers.ray_actor import _devices
from controller.launchers.ray_head import head_argv
from controller.models import Role


def test_an_instance_takes_tp_accelerators_and_its_cpus_in_one_bundle() -> None:
    gpu = load_settings(None, ray={"engine_cpus": 4})
    assert gpu.ray_accelerator == "GPU"
    assert bundle(gpu, 2) == {"CPU": 4.0, "GPU": 2.0}
    assert actor_options(gpu, 2) == {"num_cpus": 4.0, "num_gpus": 2.0}  # Ray sets its GPUs
    custom = load_settings(None, ray={"accelerator_resource": "accel"})
    assert bundle(custom, 4) == {"CPU": 1.0, "accel": 4.0}
    assert actor_options(custom, 4) == {"num_cpus": 1.0, "resources": {"accel": 4.0}}
    cpu = load_settings(None, hardware={"accelerator": "cpu-lab"}, model={"name": "lab-tiny"},
                        pools={"prefill": {"tp": 1}, "decode": {"tp": 1}})
    assert cpu.ray_accelerator == "CPU"
    assert bundle(cpu, 2) == {"CPU": 2.0}  # the cores are the accelerators


def test_cluster_capacity_is_its_accelerator_nodes_at_the_smallest_ones_count() -> None:
    assert ClusterView({"head": 0, "a": 8, "b": 8}).capacity() == (8, 2)
    assert ClusterView({"a": 8, "b": 4}).capacity() == (4, 2)  # TP must fit any node
    assert ClusterView({"head": 0}).capacity() == (1, 0)  # nothing to place on


def test_a_dead_actors_reason_names_its_node() -> None:
    info = {"node_ip": "10.0.0.3"}
    died = RuntimeError("The actor died unexpectedly before finishing this task.\n"
                        "The actor died because its node has died. Node Id: abc")
    assert died_reason(died, info) == "its Ray node (10.0.0.3) died"
    other = RuntimeError("\nThe actor died because of an error raised in its creation task")
    assert died_reason(other, info) == (
        "its Ray actor died on node 10.0.0.3: The actor died because of an error raised in "
        "its creation task")


def test_the_local_heads_command_line_offers_the_fleets_accelerators(tmp_path: Path) -> None:
    sim = load_settings(None, hardware={"accelerators_per_node": 8, "nodes": 2})
    argv = head_argv(sim, 6390)
    assert argv[1:5] == ["start", "--head", "--block", "--port"]
    assert argv[argv.index("--num-gpus") + 1] == "16"  # logical GPUs for simulated engines
    custom = load_settings(None, ray={"accelerator_resource": "accel"},
                           hardware={"accelerators_per_node": 4, "share": 2})
    argv = head_argv(custom, 6390)
    assert json.loads(argv[argv.index("--resources") + 1]) == {"accel": 8.0}
    assert "--num-gpus" not in argv
    given = load_settings(None, ray={"head_cpus": 3, "head_resources": {"x": 1}})
    argv = head_argv(given, 6390)
    assert argv[argv.index("--num-cpus") + 1] == "3"
    assert json.loads(argv[argv.index("--resources") + 1]) == {"x": 1}


def test_devices_on_a_node_are_rays_gpus_or_cores_folded_onto_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = LaunchSpec("d-1", Role.DECODE, 2, (2, 3), Path("/tmp/x.log"))
    assert _devices("GPU", spec, {"GPU": ["5", "7"]}) == ["5", "7"]
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert _devices("CPU", spec, {}) == ["0", "1"]
    assert _devices("accel", spec, {}) is None


def test_the_launcher_and_engine_kind_are_separate_settings() -> None:
    assert load_settings(None).launcher == "local"
    s = load_settings(None, backend="vllm", launcher="ray", model={"path": "/m"})
    assert (s.backend, s.launcher) == ("vllm", "ray")
    with pytest.raises(ConfigError, match="backend external runs nowhere"):
        load_settings(None, backend="external", launcher="ray",
                      pools={"decode": {"urls": ["http://x"]}})
    with pytest.raises(ConfigError, match="ray.namespace"):
        load_settings(None, ray={"namespace": "a b"})


def test_an_address_nobody_answers_is_refused_at_once_with_its_reason(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.cli import serve
    from controller.launchers.process import free_port
    from controller.launchers.ray import reachable

    with pytest.raises(ConfigError, match="nothing answers there"):
        reachable(f"127.0.0.1:{free_port()}")
    reachable("auto")  # Ray resolves these itself
    reachable("ray://head:10001")

    def cannot_join(*_: object, **__: object) -> None:
        raise ConfigError("cannot join the Ray cluster at '10.9.9.9:6379' (ray.address): x")

    monkeypatch.setattr(serve, "create_app", cannot_join)
    assert serve._serve(load_settings(None)) == 2  # a clear line, not a traceback
    assert "pdctl: cannot join the Ray cluster" in capsys.readouterr().err


def test_a_local_head_gets_a_token_on_a_machine_with_none(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.launchers.ray_head import TOKEN_FILE, ensure_local_token

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    ensure_local_token(tmp_path / "state")
    path = tmp_path / "state" / TOKEN_FILE
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(path.resolve())
    assert len(path.read_text().strip()) == 64 and (path.stat().st_mode & 0o777) == 0o600
    token = path.read_text()
    ensure_local_token(tmp_path / "state")  # kept across starts
    assert path.read_text() == token
    # An operator's own token wins: nothing is written.
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    (tmp_path / "home" / ".ray").mkdir(parents=True)
    (tmp_path / "home" / ".ray" / "auth_token").write_text("theirs")
    ensure_local_token(tmp_path / "other")
    assert "RAY_AUTH_TOKEN_PATH" not in os.environ and not (tmp_path / "other").exists()


def test_a_change_the_clusters_cpus_cannot_place_is_refused_with_the_reason(
        tmp_path: Path) -> None:
    """The Ray lab: a 2-CPU head offering 4 GPUs took a decode scale to 3 (4 engines of
    1 CPU each), whose new instances then failed placement every 120 s."""
    from controller.fleet.desired import Desired
    from controller.launchers.ray import room_problem
    from controller.models import PoolTarget
    from controller.store import Store

    s = load_settings(None, ray={"engine_cpus": 1})
    head = ClusterView({"10.0.0.1/ab": 4.0}, {"10.0.0.1/ab": 2.0})
    one = {Role.PREFILL: PoolTarget(1, 1), Role.DECODE: PoolTarget(1, 1)}
    three = {Role.PREFILL: PoolTarget(1, 1), Role.DECODE: PoolTarget(3, 1)}
    assert room_problem(s, head, one) is None
    why = room_problem(s, head, three)
    assert why is not None and "2 of 4 instances find no Ray node" in why
    assert "1 CPU, 1 GPU on one node" in why and "10.0.0.1/ab: 2 CPU, 4 GPU" in why
    # Bundles pack per node: two 3-CPU engines do not fit one 4-CPU node beside another.
    two_nodes = ClusterView({"a": 4.0, "b": 4.0}, {"a": 4.0, "b": 4.0})
    wide = load_settings(None, ray={"engine_cpus": 3})
    assert room_problem(wide, two_nodes, one) is None
    assert room_problem(wide, two_nodes, three) is not None

    desired = Desired(s, Store(tmp_path / "state.db"), True,
                      room=lambda targets: room_problem(s, head, targets))
    before = dict(desired.targets)
    with pytest.raises(InvalidChange, match="find no Ray node") as exc:
        desired.set(Role.DECODE, 3, None, "test")
    assert exc.value.field == "pools.decode.size" and desired.targets == before
