"""Settings: one YAML file plus ``PDCTL_<SECTION>__<FIELD>`` environment overrides.

Every field has a default. ``load_settings`` refuses a bad file with the field and the reason
(``ConfigError``). The pool sizes, TPs and routing values here are the *initial* desired state;
once the controller has run, the state directory's store holds the operator's changes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from controller.errors import ConfigError, InvalidChange
from controller.models import PoolTarget, Role
from controller.sizing.cpu_features import CPU_ENGINE_DTYPE, CPU_ENGINE_NICE
from controller.sizing.fit import check_targets
from pdctl_api import profiles
from pdctl_api.schema import PolicyName

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSettings(Strict):
    name: str = Field("llama-3-70b", description="model profile (see pdctl_api.profiles)")
    served_name: str | None = Field(None, description="name clients use; default: name")
    path: Path | None = Field(None, description="model directory (config.json, tokenizer.json)")

    @model_validator(mode="after")
    def _known(self) -> ModelSettings:
        if self.path is None and self.name not in profiles.MODELS:
            raise ValueError(
                f"unknown model profile {self.name!r} and no path given; "
                f"known: {', '.join(sorted(profiles.MODELS))}"
            )
        return self

    @property
    def public_name(self) -> str:
        return self.served_name or self.name


class HardwareSettings(Strict):
    accelerator: str = "h100-sxm"
    accelerators_per_node: int | None = Field(None, ge=1, description="default: the profile's")
    nodes: int = Field(4, ge=1)
    kv_link: str = "ib-ndr"
    share: int = Field(1, ge=1, le=8, description=(
        "instances that may share one accelerator; for the CPU lab, where instances beyond "
        "the core count are pinned to the same cores (correct, but slow)"))

    @model_validator(mode="after")
    def _known(self) -> HardwareSettings:
        for table, kind, value in (
            (profiles.HARDWARE, "accelerator", self.accelerator),
            (profiles.LINKS, "kv_link", self.kv_link),
        ):
            if value not in table:
                raise ValueError(f"unknown {kind} {value!r}; known: {', '.join(sorted(table))}")
        return self

    @property
    def profile(self) -> profiles.HardwareProfile:
        return profiles.hardware(self.accelerator)

    @property
    def per_node(self) -> int:
        return self.accelerators_per_node or self.profile.accelerators_per_node

    @property
    def total_accelerators(self) -> int:
        return self.per_node * self.nodes

    @property
    def is_cpu(self) -> bool:
        return self.accelerator.startswith("cpu")


class PoolSettings(Strict):
    size: int = Field(1, ge=0)
    tp: int = Field(1, ge=1)
    urls: list[str] = Field(default_factory=list, description="external backend only")
    engine_args: dict[str, Any] = Field(default_factory=dict)


def _prefill_default() -> PoolSettings:
    return PoolSettings(size=1, tp=4)


def _decode_default() -> PoolSettings:
    return PoolSettings(size=1, tp=2)


class PoolsSettings(Strict):
    prefill: PoolSettings = Field(default_factory=_prefill_default)
    decode: PoolSettings = Field(default_factory=_decode_default)

    @model_validator(mode="before")
    @classmethod
    def _role_defaults(cls, data: Any) -> Any:
        """A pool given in part keeps its role's defaults for the rest (``decode: {size: 3}``
        is TP 2, not ``PoolSettings``' TP 1)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, default in (("prefill", _prefill_default), ("decode", _decode_default)):
            given = out.get(name)
            if isinstance(given, dict):
                d = default()
                out[name] = {"size": d.size, "tp": d.tp, **given}
        return out


class RoutingSettings(Strict):
    disagg_min_prompt_tokens: int = Field(512, ge=0)
    transfer_alert_share: float = Field(0.2, gt=0, le=1)
    prefill_policy: PolicyName = "round_robin"
    decode_policy: PolicyName = "least_loaded"
    max_attempts: int = Field(3, ge=1, le=10, description="instances tried per hop")
    request_timeout_s: float = Field(600.0, gt=0, le=86_400, allow_inf_nan=False)
    max_inflight: int = Field(1024, ge=0, le=1_000_000, description=(
        "client requests in flight in this controller; one more is answered 429 with "
        "Retry-After at once (0: no limit)"))
    max_inflight_per_instance: int = Field(0, ge=0, le=1_000_000, description=(
        "requests the router has in flight on one instance; a full instance gets no new one "
        "(a full prefill pool: served colocated; a full decode pool: 429) (0: no limit)"))
    prefill_max_inflight: int = Field(0, ge=0, le=100_000, description=(
        "prompts the router has in flight on one prefill instance; beyond that, requests wait "
        "in the router, first come first served, for a slot on any prefill instance (one that "
        "becomes ready meanwhile included), so that a backlog does not sit in one engine's "
        "queue after the pool grows; the wait counts in the queue part of TTFT (0: no limit, "
        "no router queue)"))
    prefill_queue_timeout_s: float = Field(30.0, gt=0, le=3600, allow_inf_nan=False,
                                           description=(
        "longest a request waits in the router for a prefill slot; then it is served "
        "colocated"))


class TargetsSettings(Strict):
    """Service targets the console's health status and the alerting rules check (live:
    ``PATCH /api/v1/targets``)."""

    ttft_p95_ms: float = Field(2000.0, gt=0, le=3_600_000, allow_inf_nan=False)
    ttft_p99_ms: float = Field(5000.0, gt=0, le=3_600_000, allow_inf_nan=False)
    gap_p99_ms: float = Field(150.0, gt=0, le=600_000, allow_inf_nan=False, description=(
        "the 99th percentile, over streamed requests, of each one's p99 inter-token gap"))
    error_rate: float = Field(0.01, ge=0, le=1, allow_inf_nan=False, description=(
        "failed and refused requests over all requests in the window"))


class KvSettings(Strict):
    """The KV hand-off between the pools (NixlConnector's lease, both backends)."""

    lease_s: int = Field(30, ge=6, le=3600, description=(
        "seconds a prefill engine keeps a finished request's KV blocks for its decode engine "
        "(vLLM kv_connector_extra_config.kv_lease_duration; the decode engine renews it while "
        "it holds the request); fixed when an engine starts"))
    late_hop_share: float = Field(0.5, gt=0, lt=1, description=(
        "a decode hop not sent within this share of the lease after the prefill answered "
        "goes colocated instead (its KV is released); a streaming one with no token by then "
        "is aborted and served colocated (its KV read is stuck)"))


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



PlannerMode = Literal["off", "advisory", "apply"]


class PlannerSettings(Strict):
    """The SLA planner (docs/planner.md): pool sizes from TTFT and ITL targets. ``mode``,
    the targets, ``interval_s`` and ``predictor`` are the initial values; the API and the
    console change them live (kept in the state directory)."""

    mode: PlannerMode = Field("off", description=(
        "off; advisory: recommends (API, console, pdctl_planner_recommended_instances); "
        "apply: changes the pools itself (audit actor ``planner``)"))
    interval_s: float = Field(180.0, ge=1, le=86_400, description=(
        "adjustment interval: one observation, prediction and decision each"))
    predictor: Literal["constant", "holt"] = Field("constant", description=(
        "next-interval load: the last interval's (constant) or its trend (holt)"))
    ttft_ms: float = Field(2000.0, gt=0, le=3_600_000, description="target TTFT p95")
    itl_ms: float = Field(60.0, gt=0, le=60_000, description="target inter-token gap p95")
    min_requests: int = Field(10, ge=1, description=(
        "finished requests an interval needs before the planner decides on it"))
    cooldown_s: float | None = Field(None, ge=0, description=(
        "no pool shrinks within this after a change; default: two intervals"))
    scale_down_utilization: float = Field(0.7, gt=0, lt=1, description=(
        "a pool shrinks only if the survivors would run at most at this share of their "
        "profiled capacity at the predicted load"))
    min_prefill: int = Field(1, ge=0)
    max_prefill: int | None = Field(None, ge=0, description="default: what the capacity allows")
    min_decode: int = Field(1, ge=1)
    max_decode: int | None = Field(None, ge=1, description="default: what the capacity allows")
    accelerator_budget: int | None = Field(None, ge=1, description=(
        "accelerators the two pools may use together; default: the cluster's"))
    profile_dir: Path | None = Field(None, description=(
        "more performance profiles (pdctl profile --out DIR); they win over the shipped ones"))

    @model_validator(mode="after")
    def _bounds(self) -> PlannerSettings:
        for role in ("prefill", "decode"):
            lo, hi = getattr(self, f"min_{role}"), getattr(self, f"max_{role}")
            if hi is not None and hi < lo:
                raise ValueError(f"max_{role} ({hi}) is below min_{role} ({lo})")
        return self

    @property
    def cooldown(self) -> float:
        return 2 * self.interval_s if self.cooldown_s is None else self.cooldown_s


class ControllerSettings(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    state_dir: Path = Path(".pdctl")
    tick_s: float = Field(0.5, gt=0, description="reconcile and health-check period")
    metrics_poll_s: float = Field(1.0, gt=0)
    health_interval_s: float = Field(2.0, gt=0, description="health period of ready instances")
    start_timeout_s: float = Field(120.0, gt=0)
    drain_timeout_s: float = Field(120.0, gt=0)
    unhealthy_after: int = Field(3, ge=1, description="failed health checks before failed")
    crash_window_s: float = Field(600.0, gt=0, description="window in which engine crashes "
                                  "of one pool are counted for quarantine")
    quarantine_after: int = Field(3, ge=1, description="crashes of one pool within "
                                  "crash_window_s before its restarts back off (quarantine)")
    health_timeout_s: float = Field(2.0, gt=0, description="answer time of one health check")
    request_buffer: int = Field(100_000, ge=100)
    max_connections: int = Field(4096, ge=1, description=(
        "client connections (and requests) at once; beyond it the listener answers 503"))
    header_timeout_s: float = Field(10.0, gt=0, description=(
        "a connection that does not send a request's headers within this is closed (408)"))
    keep_alive_s: float = Field(75.0, gt=0, description=(
        "an idle keep-alive connection is closed after this"))
    body_timeout_s: float = Field(60.0, gt=0, description=(
        "a data-plane request whose body is not all there within this is answered 408"))
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description=(
        "a data-plane request body larger than this is answered 413"))


class PrometheusSettings(Strict):
    enabled: bool = Field(True, description="pdctl lab: start Prometheus when its binary is found")
    binary: str = Field("prometheus", description="executable name or path")
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0: a free port")
    scrape_interval_s: float = Field(
        10.0, ge=0.5, le=60,
        description="also the scrape timeout; Prometheus applies a change of the engine targets "
                    "within ~6 s (its 5 s discovery throttle, then a 1 s reload), so at 10 s "
                    "the active targets follow a pool change within one scrape interval")
    retention: str = Field("6h", pattern=r"^[0-9]+(ms|s|m|h|d|w|y)$",
                           description="--storage.tsdb.retention.time; data in STATE_DIR")


class Settings(BaseSettings):
    """The whole configuration."""

    model_config = SettingsConfigDict(
        env_prefix="PDCTL_", env_nested_delimiter="__", extra="forbid"
    )

    backend: Literal["sim", "external", "vllm"] = Field("sim", description=(
        "which engine runs: simulated, real vLLM, or engines given by URL"))
    launcher: Literal["local", "ray"] = Field("local", description=(
        "where sim and vllm engines run: local processes of the controller, or actors on a "
        "Ray cluster (docs/ray.md)"))
    model: ModelSettings = Field(default_factory=ModelSettings)
    hardware: HardwareSettings = Field(default_factory=HardwareSettings)
    pools: PoolsSettings = Field(default_factory=PoolsSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    kv: KvSettings = Field(default_factory=KvSettings)
    sim: SimSettings = Field(default_factory=SimSettings)
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    ray: RaySettings = Field(default_factory=RaySettings)
    planner: PlannerSettings = Field(default_factory=PlannerSettings)
    targets: TargetsSettings = Field(default_factory=TargetsSettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment overrides the file (which arrives as init kwargs).
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _external_urls(self) -> Settings:
        if self.backend == "external" and self.launcher != "local":
            raise ValueError("backend external runs nowhere: launcher must be local")
        if self.sim.processes and self.launcher != "local":
            raise ValueError("sim.processes hosts engines on this machine: launcher must be "
                             "local (on Ray each engine is an actor's process)")
        if self.backend == "external":
            for name in ("prefill", "decode"):
                pool: PoolSettings = getattr(self.pools, name)
                if not pool.urls and name == "decode":
                    raise ValueError("backend external needs pools.decode.urls")
                pool.size = len(pool.urls)
        return self

    @property
    def model_profile(self) -> profiles.ModelProfile:
        """The model as the engines run it (KV bytes follow the engines' dtype)."""
        profile = model_profile_for(self.model)
        dtype = self.engine_dtype
        if dtype in DTYPE_BYTES:
            profile = dataclasses.replace(profile, dtype_bytes=DTYPE_BYTES[dtype])
        return profile

    @property
    def context_len(self) -> int | None:
        """Prompt plus completion tokens the engines accept; None where unknown."""
        if self.backend == "external":
            return None
        if self.backend == "sim":  # the simulator runs the preset of this name
            return profiles.model(self.model.name).max_model_len
        return self.vllm.max_model_len or self.model_profile.max_model_len

    @property
    def kv_block_size(self) -> int:
        """Tokens per KV block on the engines (KV bytes are counted at this granularity)."""
        if self.backend != "vllm":
            return 16
        return self.vllm.block_size or (128 if self.hardware.is_cpu else 16)

    @property
    def engine_dtype(self) -> str | None:
        """The dtype the vLLM engines are started with; None: the model's own."""
        if self.backend != "vllm":
            return None
        return self.vllm.dtype or (CPU_ENGINE_DTYPE if self.hardware.is_cpu else None)

    @property
    def ray_accelerator(self) -> str:
        """The Ray resource an instance takes TP units of."""
        if self.ray.accelerator_resource:
            return self.ray.accelerator_resource
        return "CPU" if self.hardware.is_cpu else "GPU"

    @property
    def engine_nice(self) -> int:
        """The niceness the vLLM engine processes run at."""
        if self.vllm.nice is not None:
            return self.vllm.nice
        return CPU_ENGINE_NICE if self.backend == "vllm" and self.hardware.is_cpu else 0


def model_profile_for(m: ModelSettings) -> profiles.ModelProfile:
    """The model's profile: derived from ``path/config.json`` when present, else the preset."""
    if m.path is not None and (m.path / "config.json").is_file():
        return profile_from_hf_config(m.name, json.loads((m.path / "config.json").read_text()))
    return profiles.model(m.name)


def profile_from_hf_config(name: str, cfg: dict[str, Any]) -> profiles.ModelProfile:
    """Architecture numbers from a Hugging Face Llama-style ``config.json``."""
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layers = int(cfg["num_hidden_layers"])
    inter = int(cfg["intermediate_size"])
    vocab = int(cfg["vocab_size"])
    dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    return profiles.ModelProfile(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, intermediate=inter, vocab=vocab,
        params=profiles.llama_params(layers, hidden, heads, kv_heads, head_dim, inter, vocab,
                                     bool(cfg.get("tie_word_embeddings", False))),
        dtype_bytes=4 if dtype == "float32" else 2,
        max_model_len=int(cfg.get("max_position_embeddings", 8192)),
    )


def describe_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem: ``field.path: reason``."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        lines.append(f"{prefix}{loc}: {e['msg']}")
    return "; ".join(lines)


M = TypeVar("M", bound=BaseModel)


def patched(current: M, patch: dict[str, Any], prefix: str) -> M:
    """``current`` with ``patch`` applied and validated as a whole; ``InvalidChange`` naming
    the field (``prefix`` + its path) and the reason when it is not valid."""
    try:
        return type(current).model_validate({**current.model_dump(), **patch})
    except ValidationError as exc:
        field = ".".join(str(p) for p in exc.errors()[0]["loc"]) if exc.errors() else None
        raise InvalidChange(describe_validation_error(exc, prefix), field) from None


def load_settings(path: Path | None = None, defaults: dict[str, Any] | None = None,
                  **overrides: Any) -> Settings:
    """Each layer over the one before: the fields' defaults, ``defaults`` (a command's own),
    the YAML file at ``path``, the environment (``PDCTL_<SECTION>__<FIELD>``), then
    ``overrides`` (the flags actually given)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping")
        data = loaded or {}
    if defaults:
        data = deep_merge(defaults, data)
    try:
        settings = Settings(**data)
        if overrides:
            merged = deep_merge(settings.model_dump(), overrides)
            settings = Settings.model_validate(merged)
    except ValidationError as exc:
        where = f"config file {path}: " if path else "configuration: "
        raise ConfigError(where + describe_validation_error(exc)) from None
    problem = pools_problem(settings)
    if problem:
        where = f"config file {path}: " if path else "configuration: "
        raise ConfigError(f"{where}pools: {problem}")
    return settings


def pools_problem(settings: Settings) -> str | None:
    """Why the configured pools cannot run on the configured hardware (TP, pairing, memory,
    capacity: the checks of a pool change), or None. External pools are what they are; on Ray
    the cluster's capacity is checked when the controller joins it."""
    if settings.backend == "external":
        return None

    hw, pools = settings.hardware, settings.pools
    targets = {Role.PREFILL: PoolTarget(pools.prefill.size, pools.prefill.tp),
               Role.DECODE: PoolTarget(pools.decode.size, pools.decode.tp)}
    nodes = 1_000_000 if settings.launcher == "ray" else hw.nodes
    try:
        check_targets(targets, model=settings.model_profile, hw=hw.profile,
                                 per_node=hw.per_node, nodes=nodes, share=hw.share)
    except InvalidChange as exc:
        return str(exc)
    return None


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
