"""Loading and changing settings: ``load_settings`` layers the defaults, a command's own,
the YAML file, the environment and the flags given, and refuses a bad file with the field and
the reason (``ConfigError``), or pools the hardware cannot run; ``patched`` applies a live
change to one section (``InvalidChange`` naming the field)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from controller.config.settings import Settings
from controller.errors import ConfigError, InvalidChange
from controller.models import PoolTarget, Role
from controller.sizing.fit import check_targets


def describe_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem: ``field.path: reason``."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        lines.append(f"{prefix}{loc}: {e['msg']}")
    return "; ".join(lines)


SectionT = TypeVar("SectionT", bound=BaseModel)


def patched(current: SectionT, patch: dict[str, Any], prefix: str) -> SectionT:
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
            merged = deep_merge({**settings.model_dump(), "model": settings.model.given},
                                 overrides)
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
