"""The engines' configuration sections: the simulator (``sim``), vLLM (``vllm``) and the Ray
launcher (``ray``). Each applies only where ``backend`` or ``launcher`` selects it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from controller.config.sections import Strict


class SimSettings(Strict):
    time_scale: float = Field(1.0, gt=0, description="wall seconds per modelled second")
    kv_load_failure_policy: Literal["fail", "recompute"] = "fail"
    startup_delay_s: float = Field(0.5, ge=0)
    processes: int = Field(0, ge=0, le=64, description=(
        "0: each simulated instance is a process of its own; N: N host processes run them "
        "all, each instance still on its own port with its own API, metrics and log (a large "
        "simulated fleet costs the machine far less; launcher local only)"))


class VllmSettings(Strict):
    python: str | None = Field(None, description="interpreter with vLLM; default: this one")
    kv_load_failure_policy: Literal["fail", "recompute"] = "recompute"
    block_size: int | None = Field(None, ge=1, description="default: 128 on CPU, 16 on GPU")
    dtype: str | None = Field(None, description=(
        "vLLM --dtype; default: float32 on CPU hosts (vLLM 0.32's bfloat16 AMX attention "
        "kernel crashes on AMX CPUs, docs/vllm-lab.md), the model's own on GPU hosts"))
    max_model_len: int | None = Field(None, ge=16)
    cpu_kv_cache_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE per instance")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    enforce_eager: bool = False
    push_on_cpu: bool = Field(False, description=(
        "let a pool take KV push (NixlPushConnector) on CPU hosts; off: refused there, "
        "because vLLM 0.32's CPU build stalls in push mode on shared cores "
        "(docs/routing-and-accounting.md, 'Push mode')"))
    nice: int | None = Field(None, ge=0, le=19, description=(
        "niceness of the engine processes; default: 19 on CPU hosts (their busy-polling "
        "threads would otherwise starve the controller, console and Prometheus on the same "
        "cores, docs/vllm-lab.md), 0 on GPU hosts"))
    extra_env: dict[str, str] = Field(default_factory=dict)
    kv_connector_extra_config: dict[str, Any] = Field(default_factory=dict, description=(
        "more NixlConnector settings; default on CPU hosts {num_threads: 0} "
        "(docs/vllm-lab.md); kv_lease_duration comes from kv.lease_s"))

    @model_validator(mode="after")
    def _lease_from_kv(self) -> VllmSettings:
        if "kv_lease_duration" in self.kv_connector_extra_config:
            raise ValueError("set the lease with kv.lease_s, not "
                             "vllm.kv_connector_extra_config.kv_lease_duration")
        return self


class RaySettings(Strict):
    """Engines on a Ray cluster (``launcher: ray``; docs/ray.md)."""

    address: str | None = Field(None, description=(
        "the cluster to join (``auto``, ``HOST:6379``), or ``local``: a head started in the "
        "controller's process and stopped with it; default: ``local`` for ``pdctl lab``, "
        "``auto`` (RAY_ADDRESS or a head started on this machine) for ``pdctl controller``"))
    namespace: str = Field("pdctl", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description=(
        "Ray namespace of the engine actors and placement groups; one controller per "
        "namespace (a controller adopts or stops every actor it finds there)"))
    engine_cpus: float = Field(1.0, gt=0, description=(
        "Ray CPUs reserved per engine (beside its accelerators); where the accelerator "
        "resource is CPU, an engine reserves max(engine_cpus, TP) CPUs"))
    accelerator_resource: str | None = Field(None, min_length=1, description=(
        "the Ray resource an instance takes TP units of; default: GPU, or CPU on CPU hosts "
        "(a custom resource such as ``accel`` lets a test cluster stand in for GPUs)"))
    placement_timeout_s: float = Field(120.0, gt=0, description=(
        "a placement group not placed within this fails its instance (and is removed)"))
    runtime_env: dict[str, Any] = Field(default_factory=dict, description=(
        "Ray runtime environment of the engine actors (env_vars, working_dir, ...)"))
    head_cpus: int | None = Field(None, ge=1, description=(
        "a local head: CPUs it offers (default: this machine's cores x hardware.share)"))
    head_resources: dict[str, float] = Field(default_factory=dict, description=(
        "a local head: custom resources it offers (default: {accelerator_resource: "
        "accelerators_per_node x share} for a custom resource)"))
