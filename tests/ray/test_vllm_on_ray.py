"""One real vLLM CPU prefill/decode pair as Ray actors (KV over NIXL between them), on a local
Ray head in this test's private network namespace: the same token-for-token check as the
local lab (tests/engine/test_vllm_lab.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import openai
import pytest

from tests.engine.checks import (
    MODEL,
    converged,
    disaggregated_equals_colocated,
    lab_config,
    lab_model,
)
from tests.integration.harness import ControllerProc, start_controller
from tests.ray.conftest import RayCluster, actors, assert_nothing_left, engine_processes

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(2400)]
NAMESPACE = "vllm-on-ray"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    tmp = tmp_path_factory.mktemp("vllm-on-ray")
    model = lab_model(tmp)
    # One node, the head: this machine's cores, each offered twice (hardware.share), as Ray
    # CPUs; the accelerator resource of a CPU host is CPU.
    cluster = RayCluster(workers=0, head_cpus=2 * (os.cpu_count() or 1))
    cluster.connect(NAMESPACE)
    ctl = start_controller(tmp, lab_config(model, launcher="ray", ray={
        "address": cluster.address, "namespace": NAMESPACE, "placement_timeout_s": 60}),
        wait_ready=False)
    try:
        with converged(ctl, "vLLM 1P+1D on Ray"):
            yield ctl
    finally:
        try:
            assert_nothing_left(NAMESPACE)
            assert engine_processes("vllm_entry.py") == []
        finally:
            cluster.shutdown()


def test_a_vllm_pair_on_ray_answers_disaggregated_token_for_token_as_colocated(
        lab: ControllerProc) -> None:
    insts = lab.get("/instances")
    assert sorted(i["role"] for i in insts if i["state"] == "ready") == ["decode", "prefill"]
    assert all(i["node"] == "127.0.0.1" and i["pid"] is None for i in insts)
    assert actors(NAMESPACE) == sorted(i["id"] for i in insts)
    assert len(engine_processes("vllm_entry.py")) >= 2  # the engines, in the actors' groups
    with openai.OpenAI(base_url=f"{lab.url}/v1", api_key="unused", max_retries=0,
                       timeout=300) as sdk:  # closed: its pooled sockets must not leak
        disaggregated_equals_colocated(lab, sdk, MODEL, threshold=128)
    transfers = {i["id"]: i["nixl"]["transfers"] for i in lab.get("/instances")}
    assert sum(transfers.values()) > 0  # NIXL moved the KV between the two actors' engines


def test_the_engines_log_reaches_the_api_through_its_actor(lab: ControllerProc) -> None:
    prefill = next(i["id"] for i in lab.get("/instances") if i["role"] == "prefill")
    text = lab.get(f"/instances/{prefill}/log", lines=400)["log"]
    assert "pdctl: vLLM CPU attention path" in text
