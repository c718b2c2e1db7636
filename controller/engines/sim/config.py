"""The simulated engine's configuration, fixed at start, and its validation against profiles."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pdctl_api import profiles

EngineRole = Literal["prefill", "decode", "both"]
KvLoadFailurePolicy = Literal["fail", "recompute"]
# vLLM 0.32's NIXL connectors: the decode engine reads (pull) or the prefill writes (push)
KvConnector = Literal["NixlConnector", "NixlPullConnector", "NixlPushConnector"]
KV_CONNECTORS: tuple[KvConnector, ...] = ("NixlConnector", "NixlPullConnector",
                                          "NixlPushConnector")
KvTransferMode = Literal["pull", "push"]


class SimConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the known choices."""


@dataclass(frozen=True)
class SimEngineConfig:
    port: int
    host: str = "127.0.0.1"
    role: EngineRole = "both"
    hardware: str = "h100-sxm"  # pdctl_api.profiles.HARDWARE key
    model: str = "llama-3-70b"  # pdctl_api.profiles.MODELS key
    served_model_name: str | None = None  # name in /v1/models and responses; default: model
    tp: int = 1
    link: str = "ib-ndr"  # pdctl_api.profiles.LINKS key, used for KV pull time
    time_scale: float = 1.0  # wall seconds slept per modelled second
    kv_load_failure_policy: KvLoadFailurePolicy = "fail"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_lease_duration_s: float = 30.0  # wall seconds, NixlConnector's kv_lease_duration
    block_size: int = 16
    engine_id: str | None = None  # default: a fresh uuid4 hex (see server.create_engine_app)
    startup_delay_s: float = 0.0  # wall seconds of 503 on /health (models engine load)
    max_model_len: int | None = None  # context served; default: the model profile's
    # vLLM's --kv-events-config, as a dict (None: no KV events); see ``kv_events_settings``
    kv_events_config: dict[str, Any] | None = None
    # vLLM's --enable-prompt-tokens-details: usage carries prompt_tokens_details.cached_tokens
    enable_prompt_tokens_details: bool = False
    # vLLM's kv_transfer_config.kv_connector: NixlPushConnector is push mode, the others pull
    kv_connector: KvConnector = "NixlConnector"
    # push mode, decode side: wall seconds a registration waits for the prefill's write
    # (vLLM's push_registration_timeout; default: the KV lease, as vLLM's decoder_kv_blocks_ttl)
    push_registration_timeout_s: float | None = None
    # fault injection: this engine finds every prefill's side channel unreachable at start
    # (changed at run time with ``POST /sim/fault``)
    fault_kv_unreachable: bool = False

    @property
    def kv_transfer_mode(self) -> KvTransferMode:
        return "push" if self.kv_connector == "NixlPushConnector" else "pull"

    @property
    def push_timeout_s(self) -> float:
        """How long a decode engine's push registration waits for the prefill's write."""
        if self.push_registration_timeout_s is None:
            return self.kv_lease_duration_s
        return self.push_registration_timeout_s

    @property
    def kv_events_enabled(self) -> bool:
        return (self.kv_events_config is not None
                and self.kv_events_config.get("enable_kv_cache_events") is True)

    @property
    def model_profile(self) -> profiles.ModelProfile:
        """The model as served: its profile at ``max_model_len`` (validated first)."""
        return profiles.with_context(profiles.model(self.model), self.max_model_len)

    @property
    def model_name(self) -> str:
        """The name clients use: ``served_model_name`` or the profile key."""
        return self.served_model_name or self.model

    @property
    def kv_heartbeat_interval_s(self) -> float:
        """How often a decode engine renews the leases it waits on (vLLM: lease // 6)."""
        return self.kv_lease_duration_s / 6

    @property
    def kv_lease_extension_s(self) -> float:
        """How far a heartbeat pushes a lease past now (vLLM: lease * 2 // 3)."""
        return self.kv_lease_duration_s * 2 / 3


def _known(table: Mapping[str, object], kind: str, name: str) -> None:
    if name not in table:
        raise SimConfigError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")


def _positive(name: str, value: float, minimum: float, strict: bool = False) -> None:
    if not value >= minimum or (strict and value == minimum):  # NaN fails too
        relation = ">" if strict else ">="
        raise SimConfigError(f"{name} must be {relation} {minimum}, got {value}")


def validate_config(cfg: SimEngineConfig) -> None:
    """Raise ``SimConfigError`` unless ``cfg`` names known profiles and the model fits at its TP.

    A model that does not fit is refused like a real vLLM start would fail (out of memory),
    rather than simulated on memory the accelerators do not have.
    """
    _known(profiles.HARDWARE, "hardware", cfg.hardware)
    _known(profiles.MODELS, "model", cfg.model)
    _known(profiles.LINKS, "link", cfg.link)
    if cfg.role not in ("prefill", "decode", "both"):
        raise SimConfigError(f"unknown role {cfg.role!r}; known: both, decode, prefill")
    if cfg.kv_load_failure_policy not in ("fail", "recompute"):
        raise SimConfigError(f"unknown kv_load_failure_policy {cfg.kv_load_failure_policy!r}; "
                          "known: fail, recompute")
    if cfg.kv_connector not in KV_CONNECTORS:
        raise SimConfigError(f"unknown kv_connector {cfg.kv_connector!r}; "
                             f"known: {', '.join(KV_CONNECTORS)}")
    if cfg.push_registration_timeout_s is not None:
        _positive("push_registration_timeout_s", cfg.push_registration_timeout_s, 0.0,
                  strict=True)
        if math.isinf(cfg.push_registration_timeout_s):
            raise SimConfigError("push_registration_timeout_s must be finite")
    _positive("port", cfg.port, 0)
    if cfg.port > 65535:
        raise SimConfigError(f"port must be <= 65535, got {cfg.port}")
    for name, value in (("tp", cfg.tp), ("max_num_seqs", cfg.max_num_seqs),
                        ("max_num_batched_tokens", cfg.max_num_batched_tokens),
                        ("block_size", cfg.block_size)):
        _positive(name, value, 1)
    _positive("time_scale", cfg.time_scale, 0.0, strict=True)
    _positive("kv_lease_duration_s", cfg.kv_lease_duration_s, 0.0, strict=True)
    if math.isinf(cfg.kv_lease_duration_s):
        raise SimConfigError("kv_lease_duration_s must be finite")
    _positive("startup_delay_s", cfg.startup_delay_s, 0.0)
    if cfg.kv_events_config is not None:
        kv_events_settings(cfg.kv_events_config)
    try:
        served = cfg.model_profile
    except ValueError as e:
        raise SimConfigError(f"max_model_len: {e}") from None
    problem = profiles.fit_problem(served, profiles.hardware(cfg.hardware),
                                   cfg.tp)
    if problem:
        raise SimConfigError(f"{problem}; raise --tp or choose other hardware")


@dataclass(frozen=True, slots=True)
class KvEventsSettings:
    """What the KV-event publisher needs of ``--kv-events-config`` (vLLM's
    ``KVEventsConfig``: ``config/kv_events.py``)."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    buffer_steps: int
    hwm: int


def parse_kv_events_config(text: str | None) -> dict[str, Any] | None:
    """``--kv-events-config``'s JSON as a dict, checked; ``SimConfigError`` naming the field
    otherwise."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise SimConfigError(f"kv_events_config is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise SimConfigError("kv_events_config must be a JSON object")
    kv_events_settings(value)
    return value


def _kv_field(cfg: Mapping[str, Any], name: str, kind: type, default: Any) -> Any:
    value = cfg.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise SimConfigError(f"kv_events_config.{name} must be a {kind.__name__}, "
                             f"got {value!r}")
    return value


def kv_events_settings(cfg: Mapping[str, Any]) -> KvEventsSettings:
    """The publisher's settings, each field checked (``SimConfigError`` names the field).

    As vLLM: ``publisher`` defaults to ``zmq`` when events are enabled; the simulator
    publishes with ZMQ only, so another publisher is refused. Unlike vLLM (which defaults
    it to ``tcp://*:5557``), an enabled config must name its ``endpoint``."""
    on = _kv_field(cfg, "enable_kv_cache_events", bool, False)
    publisher = _kv_field(cfg, "publisher", str, "zmq" if on else "null")
    if on and publisher != "zmq":
        raise SimConfigError(f"kv_events_config.publisher must be \"zmq\" (the simulator "
                             f"publishes with ZMQ only), got {publisher!r}")
    endpoint = _kv_field(cfg, "endpoint", str, "")
    if on and not endpoint:
        raise SimConfigError("kv_events_config.endpoint is missing (e.g. \"tcp://*:5557\")")
    sizes = {}
    for name, default in (("buffer_steps", 10_000), ("hwm", 100_000),
                          ("max_queue_size", 100_000)):
        sizes[name] = _kv_field(cfg, name, int, default)
        if sizes[name] < 1:
            raise SimConfigError(f"kv_events_config.{name} must be >= 1, got {sizes[name]}")
    return KvEventsSettings(endpoint, _kv_field(cfg, "replay_endpoint", str, None) or None,
                            _kv_field(cfg, "topic", str, ""), sizes["buffer_steps"],
                            sizes["hwm"])
