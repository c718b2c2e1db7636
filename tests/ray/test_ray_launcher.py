"""Engine pools on a real local Ray cluster: simulated engines as named, detached Ray actors in
STRICT_PACK placement groups, driven through a real ``pdctl controller`` process.

Run inside a private network namespace (``make test-ray``); the cluster is
``ray.cluster_utils.Cluster`` with two worker raylets of 4 ``accel`` units each.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.harness import LONG_PROMPT, Load, start_controller
from tests.ray.conftest import (
    ACCEL,
    RayCluster,
    actors,
    assert_nothing_left,
    engine_processes,
    placement_groups,
    ray_config,
    ray_controller,
)

pytestmark = pytest.mark.timeout(420)
MODEL = "llama-3-8b"


def describe(namespace: str, instance_id: str) -> dict[str, Any]:
    import ray

    info: dict[str, Any] = ray.get(
        ray.get_actor(instance_id, namespace=namespace).describe.remote(), timeout=30)
    return info


def live(ctl: Any, role: str | None = None) -> list[dict[str, Any]]:
    return [i for i in ctl.get("/instances")
            if i["state"] in ("ready", "starting", "draining")
            and (role is None or i["role"] == role)]


def events(ctl: Any, kind: str) -> list[dict[str, Any]]:
    return [e for e in ctl.get("/events", limit=1000) if e["kind"] == kind]


def test_engines_run_as_named_actors_in_strict_pack_groups_on_ray_nodes(
        tmp_path: Path, ray_cluster: RayCluster, namespace: str) -> None:
    from ray.util import placement_group_table

    with ray_controller(tmp_path, ray_cluster, namespace,
                        pools={"prefill": {"size": 1, "tp": 2},
                               "decode": {"size": 1, "tp": 1}}) as ctl:
        insts = live(ctl)
        assert sorted((i["role"], i["tp"]) for i in insts) == [("decode", 1), ("prefill", 2)]
        assert all(i["node"] == "127.0.0.1" and i["pid"] is None for i in insts)
        assert actors(namespace) == sorted(i["id"] for i in insts)
        groups = {p["name"]: p for p in placement_group_table().values()
                  if p["state"] == "CREATED"}
        sides = {describe(namespace, i["id"])["side_channel"] for i in insts}
        assert len(sides) == len(insts)  # engines sharing a node: distinct side channels
        for inst in insts:
            pg = groups[inst["id"]]
            assert pg["strategy"] == "STRICT_PACK"
            assert pg["bundles"] == {0: {"CPU": 1.0, ACCEL: float(inst["tp"])}}
            info = describe(namespace, inst["id"])
            assert info["url"] == inst["url"]
            host, side_port = info["side_channel"].rsplit(":", 1)
            assert host == "127.0.0.1" and int(side_port) != int(inst["url"].rsplit(":", 1)[1])
            assert os.getpgid(info["pid"]) == info["pid"]  # its own process group
        launched = events(ctl, "instance.launched")
        assert {e["target"] for e in launched} == {i["id"] for i in insts}
        assert all(e["after"]["node"] == "127.0.0.1" for e in launched)

        r = httpx.post(f"{ctl.url}/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 4})
        assert r.status_code == 200, r.text
        rec = ctl.get("/requests", limit=1)[0]
        assert rec["path"] == "disaggregated" and rec["output_tokens"] == 4
        decode = next(i["id"] for i in insts if i["role"] == "decode")
        assert "decode hop" in ctl.get(f"/instances/{decode}/log", lines=50)["log"]  # via Ray


def test_scale_a_pool_up_and_down_under_load_fails_no_request(
        tmp_path: Path, ray_cluster: RayCluster, namespace: str) -> None:
    with ray_controller(tmp_path, ray_cluster, namespace) as ctl:
        with Load(ctl.url, workers=4, model=MODEL) as load:
            for size in (3, 1):
                r = ctl.api("PATCH", "/pools/decode", {"size": size})
                assert r.status_code == 200, r.text
                ctl.wait_converged(120)
                assert len(live(ctl, "decode")) == size
                time.sleep(1.0)
            result = load.stop()
        assert result.failures == [] and result.ok > 20, result.failures[:5]
        assert actors(namespace) == sorted(i["id"] for i in live(ctl))


def test_a_tp_change_rolls_onto_new_placement_groups(
        tmp_path: Path, ray_cluster: RayCluster, namespace: str) -> None:
    with ray_controller(tmp_path, ray_cluster, namespace) as ctl:
        before = {i["id"] for i in live(ctl, "prefill")}
        with Load(ctl.url, workers=2, model=MODEL) as load:
            assert ctl.api("PATCH", "/pools/prefill", {"tp": 2}).status_code == 200
            ctl.wait_converged(120)
            result = load.stop()
        assert result.failures == [], result.failures[:5]
        after = live(ctl, "prefill")
        assert [i["tp"] for i in after] == [2] and not before & {i["id"] for i in after}
        assert not before & set(actors(namespace)) and not before & set(placement_groups())
        # Beyond one node's accelerators: refused, nothing changes.
        r = ctl.api("PATCH", "/pools/prefill", {"tp": 8})
        assert r.status_code == 422 and "4 accelerators per node" in r.json()["detail"]


def test_a_killed_engine_process_is_replaced_and_its_actor_removed(
        tmp_path: Path, ray_cluster: RayCluster, namespace: str) -> None:
    with ray_controller(tmp_path, ray_cluster, namespace) as ctl:
        victim = live(ctl, "decode")[0]["id"]
        os.kill(describe(namespace, victim)["pid"], signal.SIGKILL)
        ctl.wait(lambda: any(i["id"] == victim and i["state"] == "failed"
                             for i in ctl.get("/instances")), 30, f"{victim} failed")
        failed = next(i for i in ctl.get("/instances") if i["id"] == victim)
        assert "SIGKILL" in failed["last_error"]
        ctl.wait_converged(60)
        ctl.wait(lambda: victim not in actors(namespace)
                 and victim not in placement_groups(), 30, "its actor and group removed")
        assert len(live(ctl, "decode")) == 1


def test_a_placement_group_that_cannot_be_placed_fails_its_instance_cleanly(
        tmp_path: Path, ray_cluster: RayCluster, namespace: str) -> None:
    """The cluster reports room (its nodes' accelerators) that something else holds: the
    instance fails visibly after the placement timeout and leaves no group behind."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    ray_cluster.connect(namespace)
    hog = placement_group([{ACCEL: 3.0}] * len(ray_cluster.workers), strategy="SPREAD",
                          name="hog")
    ray.get(hog.ready(), timeout=30)
    try:
        with ray_controller(tmp_path, ray_cluster, namespace, wait_ready=False,
                            pools={"prefill": {"size": 1, "tp": 1},
                                   "decode": {"size": 1, "tp": 2}},
                            ray={"placement_timeout_s": 3}) as ctl:
            ctl.wait(lambda: any(i["role"] == "decode" and i["state"] == "failed"
                                 for i in ctl.get("/instances")), 60, "decode failed")
            failed = next(i for i in ctl.get("/instances")
                          if i["role"] == "decode" and i["state"] == "failed")
            assert failed["last_error"].startswith("launch failed: no Ray node could take")
            assert "within 3 s" in failed["last_error"]
            ev = [e for e in events(ctl, "instance.failed") if e["target"] == failed["id"]]
            assert ev and "no Ray node could take" in ev[0]["detail"]
            assert failed["id"] not in placement_groups()
            assert failed["id"] not in actors(namespace)
    finally:
        remove_placement_group(hog)


def test_a_removed_nodes_instances_are_replaced_on_another_node(
        tmp_path: Path, namespace: str) -> None:
    """Four nodes of 2 accelerators; decode 2 x TP2 fills two of them, so losing one leaves
    the other decode serving while the lost one is replaced on the spare node."""
    cluster = RayCluster(workers=4, per_node=2)
    try:
        with ray_controller(tmp_path, cluster, namespace,
                            pools={"prefill": {"size": 1, "tp": 1},
                                   "decode": {"size": 2, "tp": 2}}) as ctl:
            decode = live(ctl, "decode")[0]["id"]
            node_id = describe(namespace, decode)["node_id"]
            node = next(n for n in cluster.workers if n.node_id == node_id)
            on_it = {i["id"] for i in live(ctl) if describe(namespace, i["id"])["node_id"]
                     == node_id}
            with Load(ctl.url, workers=2, model=MODEL, pause_s=0.05) as load:
                time.sleep(1.0)
                cluster.cluster.remove_node(node)
                ctl.wait(lambda: all(i["state"] == "failed" for i in ctl.get("/instances")
                                     if i["id"] in on_it), 60, "its instances failed")
                ctl.wait_converged(120)
                time.sleep(1.0)
                result = load.stop()
            failed = [i for i in ctl.get("/instances") if i["id"] in on_it]
            assert all("Ray node (127.0.0.1) died" in (i["last_error"] or "")
                       for i in failed), failed
            now = live(ctl)
            assert all(describe(namespace, i["id"])["node_id"] != node_id for i in now)
            assert sorted((i["role"], i["tp"]) for i in now) == [
                ("decode", 2), ("decode", 2), ("prefill", 1)]
            # Requests that had not received a byte went to the other decode instance; one
            # mid-answer on the lost node may fail: never more than the clients in flight.
            assert result.ok > 0 and len(result.failures) <= 2, result.failures
    finally:
        cluster.shutdown()


def test_a_sigkilled_controller_restarted_adopts_its_live_actors(
        tmp_path: Path, ray_cluster: RayCluster, namespace: str) -> None:
    ray_cluster.connect(namespace)
    cfg = ray_config(ray_cluster.address, namespace,
                     pools={"prefill": {"size": 1, "tp": 1}, "decode": {"size": 2, "tp": 1}})
    ctl = start_controller(tmp_path, cfg)
    port = int(ctl.url.rsplit(":", 1)[1])
    before = {i["id"]: i["url"] for i in live(ctl)}
    engines_before = sorted(engine_processes())
    ctl.proc.send_signal(signal.SIGKILL)
    ctl.proc.wait()
    assert actors(namespace) == sorted(before)  # detached: they outlive their controller
    # The operator shrinks decode while the controller is down (the config's pools are only
    # the initial state; the store keeps 2, so the change goes through the restarted API).
    ctl = start_controller(tmp_path, {**cfg, "controller": {**cfg["controller"],
                                                            "port": port}})
    try:
        after = {i["id"]: i["url"] for i in live(ctl)}
        assert after == before  # the same instances, same engines: no duplicate
        assert sorted(engine_processes()) == engines_before
        adopted = events(ctl, "instance.adopted")
        assert sorted(e["target"] for e in adopted) == sorted(before)
        assert events(ctl, "instance.starting")[0]["id"] < adopted[-1]["id"]  # none since
        r = httpx.post(f"{ctl.url}/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert ctl.api("PATCH", "/pools/decode", {"size": 1}).status_code == 200
        ctl.wait_converged(60)
        assert len(actors(namespace)) == 2
    finally:
        ctl.stop()
    assert_nothing_left(namespace)


def test_a_restarted_controller_stops_actors_it_no_longer_wants(
        tmp_path: Path, ray_cluster: RayCluster, namespace: str) -> None:
    """Adopted only when wanted: after a SIGKILL, a controller restarted on a state whose
    decode pool is now TP 2 stops the TP-1 decode actor and starts a TP-2 one."""
    ray_cluster.connect(namespace)
    cfg = ray_config(ray_cluster.address, namespace)
    ctl = start_controller(tmp_path, cfg)
    port = int(ctl.url.rsplit(":", 1)[1])
    old_decode = live(ctl, "decode")[0]["id"]
    ctl.proc.send_signal(signal.SIGKILL)
    ctl.proc.wait()
    from controller.store import Store

    store = Store(Path(cfg["controller"].get("state_dir", tmp_path / "state")) / "state.db")
    desired = store.get("desired")
    store.put("desired", {**desired, "decode": {"size": 1, "tp": 2}})
    store.close()
    ctl = start_controller(tmp_path, {**cfg, "controller": {**cfg["controller"],
                                                            "port": port}})
    try:
        ev = [e for e in events(ctl, "instance.failed") if e["target"] == old_decode]
        assert "not wanted" in ev[0]["detail"] and "has been stopped" in ev[0]["detail"]
        ctl.wait_converged(60)
        assert [i["tp"] for i in live(ctl, "decode")] == [2]
        assert old_decode not in actors(namespace)
    finally:
        ctl.stop()
    assert_nothing_left(namespace)
