"""Who this browser session is and which controller it talks to: the console's settings, the
controller's client with this session's token and operator, and the session-state keys tests
put a fake client, config or Prometheus under."""

from __future__ import annotations

import streamlit as st

from dashboard.client import ACTOR, ControllerClient
from dashboard.config import ConsoleConfig, current_config

# Tests put a fake client / config here (``AppTest.session_state``) instead of a real one.
CLIENT_KEY = "pdctl_client"
OPERATOR_KEY = "pdctl_operator"
PROM_KEY = "pdctl_prom"
CONFIG_KEY = "pdctl_config"
DOWN_KEY = "pdctl_down"
TOKEN_KEY = "pdctl_entered_token"  # a token the operator entered in this browser session


def config() -> ConsoleConfig:
    cfg = st.session_state.get(CONFIG_KEY)
    return cfg if isinstance(cfg, ConsoleConfig) else current_config()


@st.cache_resource(max_entries=16, show_spinner=False)
def _client_for(url: str, token: str | None, actor: str = ACTOR) -> ControllerClient:
    return ControllerClient(url, token, actor=actor)


def operator_actor() -> str:
    """Who the audit log names for this session's changes: ``pdctl-console``, or
    ``pdctl-console/<name>`` once the operator gave a name in the sidebar."""
    name = "".join(ch for ch in str(st.session_state.get(OPERATOR_KEY) or "").strip()
                   if ch.isprintable())
    return f"{ACTOR}/{name}"[:64] if name else ACTOR


@st.cache_resource(max_entries=16, show_spinner=False)
def _with_token(key: str, token: str, _base: ControllerClient) -> ControllerClient:
    return _base.with_token(token)


def client() -> ControllerClient:
    """The controller's client: with the token the operator entered in this session, if any,
    else the configured one (``PDCTL_TOKEN``, the token file)."""
    injected = st.session_state.get(CLIENT_KEY)
    if isinstance(injected, ControllerClient):
        base = injected
    else:
        cfg = config()
        token, _ = cfg.token()
        base = _client_for(cfg.controller_url, token, operator_actor())
    entered = st.session_state.get(TOKEN_KEY)
    return _with_token(base.cache_key, entered, base) if entered else base


def token_source(cfg: ConsoleConfig) -> str:
    """Where this session's token comes from, in words."""
    if st.session_state.get(TOKEN_KEY):
        return "the token entered in this console session"
    return cfg.token()[1]
