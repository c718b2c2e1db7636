"""The whole configuration (``Settings``: every section, the environment over the file) and
what follows from it: the model's profile as the engines run it, its context length, KV block
size, dtype and the engines' niceness."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from controller.config import engines, sections
from controller.sizing.cpu_features import CPU_ENGINE_DTYPE, CPU_ENGINE_NICE
from pdctl_api import profiles

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


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
    model: sections.ModelSettings = Field(default_factory=sections.ModelSettings)
    hardware: sections.HardwareSettings = Field(default_factory=sections.HardwareSettings)
    pools: sections.PoolsSettings = Field(default_factory=sections.PoolsSettings)
    routing: sections.RoutingSettings = Field(default_factory=sections.RoutingSettings)
    kv: sections.KvSettings = Field(default_factory=sections.KvSettings)
    sim: engines.SimSettings = Field(default_factory=engines.SimSettings,
                                     description="backend sim only")
    vllm: engines.VllmSettings = Field(default_factory=engines.VllmSettings,
                                       description="backend vllm only")
    ray: engines.RaySettings = Field(default_factory=engines.RaySettings)
    planner: sections.PlannerSettings = Field(default_factory=sections.PlannerSettings)
    targets: sections.TargetsSettings = Field(default_factory=sections.TargetsSettings)
    controller: sections.ControllerSettings = Field(
        default_factory=sections.ControllerSettings)
    prometheus: sections.PrometheusSettings = Field(
        default_factory=sections.PrometheusSettings, description="pdctl lab only")

    # External engines' own context (the least of their /v1/models max_model_len), learnt at
    # start (``served_by_engines``).
    _engines_context: int | None = PrivateAttr(None)

    def served_by_engines(self, model: str, context: int | None) -> Settings:
        """A copy serving ``model`` under its engines' name, with their context."""
        out = self.model_copy(deep=True)
        out.model.served_name = model
        out._engines_context = context
        return out

    @property
    def served_context(self) -> int | None:
        """The context clients are told (``/v1/models``): ``context_len``, else external
        engines' own; None where neither is known."""
        return self.context_len or self._engines_context

    @property
    def time_scale(self) -> float:
        """Wall seconds per modelled second: a simulated fleet's ``sim.time_scale``, else 1."""
        return self.sim.time_scale if self.backend == "sim" else 1.0

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
    def _model_known(self) -> Settings:
        """Engines pdctl runs need the model's numbers (a profile, or a directory with
        config.json); external engines may serve any model (``controller.launchers.
        external_model`` learns its name at start)."""
        m = self.model
        if self.backend == "external":
            return self
        if m.name is None:
            m.imply(sections.DEFAULT_MODEL)
        if not m.has_architecture:
            raise ValueError(
                f"model: unknown model profile {m.name!r} and no path given; "
                f"known: {', '.join(sorted(profiles.MODELS))}")
        return self

    @model_validator(mode="after")
    def _external_urls(self) -> Settings:
        if self.backend == "external" and self.launcher != "local":
            raise ValueError("backend external runs nowhere: launcher must be local")
        if self.sim.processes and self.launcher != "local":
            raise ValueError("sim.processes hosts engines on this machine: launcher must be "
                             "local (on Ray each engine is an actor's process)")
        if self.backend == "external":
            for name in ("prefill", "decode"):
                pool: sections.PoolSettings = getattr(self.pools, name)
                if not pool.urls and name == "decode":
                    raise ValueError("backend external needs pools.decode.urls")
                pool.size = len(pool.urls)
        return self

    @model_validator(mode="after")
    def _context(self) -> Settings:
        """``model.max_model_len``: refused for external engines (they report their own) and
        above the model's own context; for vLLM it is ``vllm.max_model_len`` (which, given
        too, must agree)."""
        want = self.model.max_model_len
        if want is not None:
            if self.backend == "external":
                raise ValueError("model.max_model_len applies to engines pdctl starts; "
                                 "external engines serve the context they were started with")
            if self.backend == "vllm":
                if self.vllm.max_model_len not in (None, want):
                    raise ValueError(
                        f"model.max_model_len {want} and vllm.max_model_len "
                        f"{self.vllm.max_model_len} differ; give one")
                self.vllm.max_model_len = want
        try:
            native = self._native_profile
        except (KeyError, UnknownArchitecture):  # vLLM's (or the engines') own check applies
            return self
        try:
            profiles.with_context(native, self._max_model_len)
        except ValueError as exc:
            where = "model.max_model_len" if want is not None else "vllm.max_model_len"
            raise ValueError(f"{where}: {exc}") from None
        return self

    @property
    def _native_profile(self) -> profiles.ModelProfile:
        """The model at its own context: the simulator runs the preset of this name, vLLM
        the model directory's config.json when there is one."""
        if self.backend == "sim":
            return profiles.model(self.model.name or "")
        return model_profile_for(self.model)

    @property
    def _max_model_len(self) -> int | None:
        """The configured context, or None for the model's own."""
        if self.backend == "vllm":
            return self.vllm.max_model_len or self.model.max_model_len
        if self.backend == "sim":
            return self.model.max_model_len
        return None

    @property
    def known_profile(self) -> profiles.ModelProfile | None:
        """``model_profile``, or None where the architecture is unknown (external engines
        serving a model with no profile and no path): KV bytes, capacity and memory checks
        then say "unknown" rather than guess."""
        return self.model_profile if self.model.has_architecture else None

    @property
    def model_profile(self) -> profiles.ModelProfile:
        """The model as the engines run it: KV bytes follow the engines' dtype, and
        ``max_model_len`` is the configured context (``model.max_model_len``) where given.
        Raises ``UnknownArchitecture`` where ``known_profile`` is None."""
        profile = model_profile_for(self.model)
        dtype = self.engine_dtype
        if dtype in DTYPE_BYTES:
            profile = dataclasses.replace(profile, dtype_bytes=DTYPE_BYTES[dtype])
        if self._max_model_len is not None:  # checked against the native one at validation
            profile = dataclasses.replace(profile, max_model_len=self._max_model_len)
        return profile

    @property
    def context_len(self) -> int | None:
        """Prompt plus completion tokens the engines accept; None where unknown."""
        if self.backend == "external":
            return None
        if self.backend == "sim":  # the simulator runs the preset of this name
            return self.model.max_model_len or profiles.model(self.model.name or "").max_model_len
        return self.model_profile.max_model_len

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


class UnknownArchitecture(LookupError):
    """The model has no profile and no config.json: its architecture numbers are unknown."""


def model_profile_for(m: sections.ModelSettings) -> profiles.ModelProfile:
    """The model's profile: derived from ``path/config.json`` when present, else the preset;
    raises ``UnknownArchitecture`` for neither."""
    name = m.name or m.public_name
    if m.path is not None and (m.path / "config.json").is_file():
        return profile_from_hf_config(name, json.loads((m.path / "config.json").read_text()))
    if m.name not in profiles.MODELS:
        raise UnknownArchitecture(
            f"model {name!r}: no profile (pdctl_api.profiles) and no model.path with a "
            "config.json, so its architecture numbers are unknown")
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
