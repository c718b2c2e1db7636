"""The configuration's sections other than the engines' (``controller.config.engines``):
model, hardware, pools, routing, targets, the KV hand-off, the planner, the controller's own
server and Prometheus. The fields the control API changes live take their type, bounds and
description from ``pdctl_api.schema``: ``routing`` and ``targets`` are the API's answers with
the configuration's defaults; the planner's mode, targets, interval and predictor and a pool's
size and TP use the API's types."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from pdctl_api import profiles
from pdctl_api.schema.cluster import InstanceCount, KvMode, TensorParallel
from pdctl_api.schema.planner import (
    PlannerIntervalS,
    PlannerItlMs,
    PlannerModeSetting,
    PlannerTtftMs,
    PredictorSetting,
)
from pdctl_api.schema.routing import (
    MaxAttempts,
    MaxInflight,
    MinPromptTokens,
    PolicyName,
    RequestTimeoutS,
    RoutingPublic,
    TransferAlertShare,
)
from pdctl_api.schema.targets import ErrorRate, GapP99Ms, TargetsPublic, TtftP95Ms, TtftP99Ms

DEFAULT_MODEL = "llama-3-70b"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSettings(Strict):
    name: str | None = Field(None, description=(
        "model profile (see pdctl_api.profiles): its architecture numbers; default "
        f"{DEFAULT_MODEL} (sim, vllm). External engines: the name they serve (their "
        "/v1/models) unless given; a name with no profile and no path serves with the "
        "architecture unknown"))
    served_name: str | None = Field(None, description="name clients use; default: name")
    path: Path | None = Field(None, description="model directory (config.json, tokenizer.json)")
    max_model_len: int | None = Field(None, ge=16, description=(
        "context the engines serve, prompt plus completion tokens (vLLM --max-model-len); "
        "default: the model's own (its profile's or config.json's max_position_embeddings); "
        "at most that. Memory is checked for one sequence of this length at every pool's TP"))

    # The name was not given: the backend's default (``imply``), left out of a re-layering.
    _implied: bool = PrivateAttr(False)

    def imply(self, name: str) -> None:
        """Take ``name`` as the model where none was given (engines pdctl runs)."""
        self.name, self._implied = name, True

    @property
    def given(self) -> dict[str, Any]:
        """The section as given: without an implied name (``load_settings`` lays flags over
        it, and a backend given there implies its own)."""
        out = self.model_dump()
        if self._implied:
            out["name"] = None
        return out

    @property
    def public_name(self) -> str:
        """The name clients send in ``model`` ("" only before an external backend learnt
        its engines' one)."""
        return self.served_name or self.name or ""

    @property
    def profile_name(self) -> str:
        """The name profiles are found by: ``name`` (always set for sim and vllm), else the
        served name (external engines serving a model pdctl has no profile for)."""
        return self.name or self.public_name

    @property
    def has_architecture(self) -> bool:
        """Whether a profile or the model directory's config.json gives the numbers."""
        return (self.name in profiles.MODELS
                or (self.path is not None and (self.path / "config.json").is_file()))


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
    size: InstanceCount = 1
    tp: TensorParallel = 1
    kv_mode: KvMode = Field("pull", description=(
        "KV transfer: pull (vLLM's NixlConnector) or push (NixlPushConnector); not on the "
        "external backend"))
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


class RoutingSettings(RoutingPublic):
    """The routing settings the API shows and changes (``PATCH /api/v1/routing``), with the
    configuration's defaults; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    disagg_min_prompt_tokens: MinPromptTokens = 512
    transfer_alert_share: TransferAlertShare = 0.2
    prefill_policy: PolicyName = "round_robin"
    decode_policy: PolicyName = "least_loaded"
    max_attempts: MaxAttempts = 3
    request_timeout_s: RequestTimeoutS = 600.0
    max_inflight: MaxInflight = 1024
    # max_inflight_per_instance, prefill_max_inflight, prefill_queue_timeout_s: the API's
    # defaults (0: no limit, 0: no router prefill queue, 30 s).


class TargetsSettings(TargetsPublic):
    """Service targets the console's health status and the alerting rules check (live:
    ``PATCH /api/v1/targets``), with the configuration's defaults."""

    model_config = ConfigDict(extra="forbid")

    ttft_p95_ms: TtftP95Ms = 2000.0
    ttft_p99_ms: TtftP99Ms = 5000.0
    gap_p99_ms: GapP99Ms = 150.0
    error_rate: ErrorRate = 0.01


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


class PlannerSettings(Strict):
    """The SLA planner (docs/planner.md): pool sizes from TTFT and ITL targets. ``mode``,
    the targets, ``interval_s`` and ``predictor`` are the initial values; the API and the
    console change them live (kept in the state directory)."""

    mode: PlannerModeSetting = "off"
    interval_s: PlannerIntervalS = 180.0
    predictor: PredictorSetting = "constant"
    ttft_ms: PlannerTtftMs = 2000.0
    itl_ms: PlannerItlMs = 60.0
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
    lookahead: bool = Field(False, description=(
        "before a decision is applied, play the recorded traffic of the last "
        "lookahead_window_s on the proposed pools in the discrete-event fleet and correct "
        "the sizes (docs/planner.md)"))
    lookahead_window_s: float = Field(300.0, gt=0, le=3600, description=(
        "modelled seconds of recent traffic the look-ahead replays"))
    instance_start_s: float = Field(60.0, ge=0, le=3600, description=(
        "modelled seconds from asking for an instance to its first request, as the "
        "look-ahead assumes"))
    tp_advice: bool = Field(False, description=(
        "every pass, play the recorded traffic of the last lookahead_window_s with each TP "
        "either pool may take and recommend one that serves it as well for fewer "
        "accelerators (never applied: reviewed and confirmed on the console)"))

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
        "client connections (and requests) at once; beyond it the listener answers 503. "
        "With data_workers above 1 each process takes its share (rounded up)"))
    header_timeout_s: float = Field(10.0, gt=0, description=(
        "a connection that does not send a request's headers within this is closed (408)"))
    keep_alive_s: float = Field(75.0, gt=0, description=(
        "an idle keep-alive connection is closed after this"))
    body_timeout_s: float = Field(60.0, gt=0, description=(
        "a data-plane request whose body is not all there within this is answered 408"))
    data_workers: int | None = Field(None, ge=1, le=32, description=(
        "processes serving the data plane on the controller's address (SO_REUSEPORT): the "
        "controller's own and data_workers - 1 router workers, each routing requests itself "
        "on the fleet's shared view; 1: the controller alone; unset: one per 4 CPU cores, "
        "1 to 4 (the rest are the engines')"))
    api_key: str | None = Field(None, min_length=1, description=(
        "the data plane's API key (as vLLM's --api-key): OpenAI clients send it as "
        "'Authorization: Bearer <key>' on /v1/*, else 401; off when unset. Prefer the "
        "environment (PDCTL_CONTROLLER__API_KEY) to the file"))
    otlp_traces_endpoint: str | None = Field(None, description=(
        "OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces): a span per client "
        "request with its TTFT parts; needs the otel extra; off when unset"))
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description=(
        "a data-plane request body larger than this is answered 413"))

    @property
    def data_processes(self) -> int:
        """Processes serving the data plane: ``data_workers``, or where it is unset one per
        4 CPU cores, 1 to 4."""
        if self.data_workers is not None:
            return self.data_workers
        return max(1, min(4, (os.cpu_count() or 1) // 4))


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
