"""The model external engines serve, learnt from their own ``GET /v1/models`` at start.

One controller fronts one model, under the name its engines serve: the router passes the
client's ``model`` to the engines unchanged, so a configured name they do not serve would
have every request refused. ``resolve`` therefore

- asks every configured URL (prefill and decode pools) once, and again every few seconds
  while none has answered and the configuration names no model (with a progress line);
- refuses to start when two engines serve different models, or when the configuration names
  one the engines do not serve (the message says which field to set);
- otherwise serves the engines' model: ``model.served_name`` becomes their name when not
  given. Without a profile or a model directory for it (``model.name`` / ``model.path``),
  the architecture is unknown and what needs it (KV bytes, capacity) says so; a model served
  under a profile's own name takes that profile.

Engines that do not answer in time are named in a warning and watched like any instance.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from controller.config import Settings
from controller.errors import ConfigError
from pdctl_api import profiles

log = logging.getLogger("pdctl.controller")

ASK_TIMEOUT_S = 5.0  # one engine's /v1/models
WAIT_S = 60.0  # for a first answer when the configuration names no model
RETRY_S = 2.0


@dataclass(frozen=True, slots=True)
class Answered:
    """One engine's ``/v1/models``: the model it serves and its context (vLLM reports it)."""

    url: str
    model: str
    max_model_len: int | None


def ask(url: str, timeout_s: float = ASK_TIMEOUT_S) -> Answered | str:
    """The engine's served model, or why it could not be read."""
    try:
        r = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=timeout_s)
        r.raise_for_status()
        first = r.json()["data"][0]
        model = first["id"]
        if not isinstance(model, str) or not model:
            return "its /v1/models gave no model id"
        ctx = first.get("max_model_len")
        return Answered(url, model, ctx if isinstance(ctx, int) and ctx > 0 else None)
    except httpx.HTTPStatusError as exc:
        return f"GET /v1/models answered {exc.response.status_code}"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except (ValueError, KeyError, IndexError, TypeError):
        return "its /v1/models is not an OpenAI model list"


def ask_all(urls: list[str], asker: Callable[[str], Answered | str] = ask,
            wait_s: float = 0.0, progress: Callable[[str], None] = log.info,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep
            ) -> tuple[list[Answered], dict[str, str]]:
    """Every URL asked once; asked again every ``RETRY_S`` for up to ``wait_s`` while none
    has answered. Returns the answers and, by URL, why the others could not be read."""
    deadline = clock() + wait_s
    while True:
        answered: list[Answered] = []
        failed: dict[str, str] = {}
        for url in urls:
            got = asker(url)
            if isinstance(got, Answered):
                answered.append(got)
            else:
                failed[url] = got
        left = deadline - clock()
        if answered or left <= 0:
            return answered, failed
        progress(f"waiting for the external engines to answer GET /v1/models "
                 f"({left:.0f} s left): " + "; ".join(f"{u}: {w}" for u, w in failed.items()))
        sleep(min(RETRY_S, left))


def agreed(settings: Settings, answered: list[Answered], failed: dict[str, str]) -> Settings:
    """``settings`` serving the engines' model; ``ConfigError`` when they disagree, when the
    configuration names another, or when none answered and none is named."""
    named = settings.model.public_name
    models = sorted({a.model for a in answered})
    if len(models) > 1:
        raise ConfigError(
            "external engines serve different models (one controller fronts one model): "
            + "; ".join(f"{a.url} serves {a.model!r}" for a in answered))
    if not models:
        why = "; ".join(f"{u}: {w}" for u, w in failed.items())
        if named:
            log.warning("no external engine answered GET /v1/models (%s); serving %r as "
                        "configured", why, named)
            return settings
        raise ConfigError(
            f"no external engine answered GET /v1/models ({why}): start the engines first, "
            "or name the model they serve (model.served_name)")
    model = models[0]
    if named and named != model:
        field = "model.served_name" if settings.model.served_name else "model.name"
        raise ConfigError(
            f"the external engines serve {model!r}, but {field} is {named!r}: clients "
            f"asking for {named!r} would be refused by the engines. Set model.served_name: "
            f"{model} (model.name may still name a profile for the architecture numbers)")
    for url, why in failed.items():
        log.warning("%s did not answer GET /v1/models (%s); watched like any instance", url,
                    why)
    contexts = [a.max_model_len for a in answered if a.max_model_len]
    out = settings.served_by_engines(model, min(contexts) if contexts else None)
    if out.model.name is None and model in profiles.MODELS:  # served under a profile's name
        out.model.name = model
    if not out.model.has_architecture:
        log.warning("model %r has no profile (model.name) and no model.path: its "
                    "architecture is unknown, so KV bytes and capacity are not reported",
                    model)
    return out


def resolve(settings: Settings, asker: Callable[[str], Answered | str] = ask,
            progress: Callable[[str], None] = log.info) -> Settings:
    """``settings`` for external engines, serving the model they serve (module doc)."""
    if settings.backend != "external":
        return settings
    urls = [*settings.pools.prefill.urls, *settings.pools.decode.urls]
    wait = 0.0 if settings.model.public_name else WAIT_S
    answered, failed = ask_all(urls, asker, wait, progress)
    return agreed(settings, answered, failed)
