"""A failed call to the controller, as the console shows it: the operator-facing explanation
of an ``ApiError``; ``card``, a card that shows it in place of what it could not draw;
``quietly``, a read whose failure another part of the page explains; ``attempt``, a change
(or its dry run) whose failure is its outcome; and that outcome, shown."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import streamlit as st

from dashboard.client import ApiError
from dashboard.config import ConsoleConfig
from dashboard.ui.session import config, token_source
from pdctl_api.client import BAD_TOKEN, NO_TOKEN

Returned = TypeVar("Returned")
Fallback = TypeVar("Fallback")
CardArgs = ParamSpec("CardArgs")


def explain(exc: ApiError, cfg: ConsoleConfig | None = None) -> str:
    """An operator-facing explanation of a failed call: what happened and what to do."""
    cfg = cfg or config()
    url = cfg.controller_url
    source = token_source(cfg)
    if exc.unreachable and exc.detail == BAD_TOKEN:
        return (f"The API token read from {source} {BAD_TOKEN.removeprefix('the API token ')}."
                " Enter the controller's token below, or fix where it came from.")
    if exc.unreachable and exc.detail == NO_TOKEN:
        return (f"No API token: the console reads it from `PDCTL_TOKEN` or `{source}`, and "
                "found none. Point `--state-dir` / `PDCTL_STATE_DIR` at the controller's "
                "state directory, or set `PDCTL_TOKEN`.")
    if exc.unreachable:
        return (f"Cannot reach the controller at {url} ({exc.detail}). Is it running? Start "
                "one with `pdctl lab` or `pdctl controller`, or point the console at it with "
                f"`--controller URL` / `PDCTL_URL`. Retrying every {cfg.refresh_s:g} s.")
    if exc.unauthorized:
        return (f"The controller at {url} refused the API token (401: {exc.detail}). The "
                f"token was read from {source}; it must match the controller's "
                "`STATE_DIR/token` (or `STATE_DIR/viewer-token`): enter one below, or start "
                "the console with the controller's `--state-dir`, or set `PDCTL_TOKEN`.")
    return f"The controller answered {exc.status}: {exc.detail}"


def card_error(exc: ApiError) -> None:
    """Inside a live card: short, since the page banner explains connection problems."""
    if exc.unreachable or exc.unauthorized:
        st.warning("No data: the controller is not answering (see above).", icon="⚠️")
    else:
        st.error(explain(exc))


def card(draw: Callable[CardArgs, None]) -> Callable[CardArgs, None]:
    """A card whose calls to the controller may fail: the first ``ApiError`` ends it, and
    ``card_error`` says why where it stopped (what it drew before stays)."""

    @functools.wraps(draw)
    def drawn(*args: CardArgs.args, **kwargs: CardArgs.kwargs) -> None:
        try:
            draw(*args, **kwargs)
        except ApiError as exc:
            card_error(exc)

    return drawn


def quietly(call: Callable[[], Returned], default: Fallback) -> Returned | Fallback:
    """``call()``, or ``default`` where it fails: for a read that only adds to a card (marks,
    a preview, a banner's detail) whose failure the card or the connection banner explains."""
    try:
        return call()
    except ApiError:
        return default


def attempt(call: Callable[[], Returned]) -> Returned | ApiError:
    """``call()``'s answer, or the ``ApiError`` it failed with: a change, or its dry run,
    whose refusal is its outcome (kept, then shown by ``change_outcome``)."""
    try:
        return call()
    except ApiError as exc:
        return exc


def change_outcome(ok: bool, body: Any) -> None:
    """A change's result: a toast when it was sent, else the controller's refusal verbatim
    (or why it could not be reached)."""
    if ok:
        st.toast(str(body), icon=":material/check_circle:")
    elif isinstance(body, ApiError) and body.refused:
        st.error(f"Refused by the controller (HTTP {body.status}); nothing was changed:\n\n"
                 f"{body.detail}", icon=":material/block:")
    else:
        st.error(explain(body), icon=":material/block:")
