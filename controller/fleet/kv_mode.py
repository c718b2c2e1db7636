"""Whether a pool may take a KV transfer mode: ``pull`` (vLLM's NixlConnector: the decode
engine reads the prefill's KV once the prefill hop is done) or ``push`` (vLLM 0.32's
NixlPushConnector: the router sends both hops at once, the decode hop naming the prefill
engine's NIXL identity, and the prefill engine writes the KV into the decode engine's blocks).

``kv_mode_refusal`` is pure: the backend's ability to run push is found out by the caller
(``push_capability``; for vLLM, ``controller.launchers.vllm.push_refusal``, which looks at the
installed vLLM once, lazily) and passed in.
"""

from __future__ import annotations

from controller.config import Settings
from controller.launchers.vllm import push_refusal
from controller.models import Role

POOL_KV_MODES = ("pull", "push")

EXTERNAL_PUSH_REFUSAL = (
    "KV push needs each prefill engine's NIXL identity in the decode hop, and the controller "
    "does not know the NIXL identity (engine id, side channel) of engines it did not start "
    "(backend external); attach them in pull mode")


def kv_mode_refusal(role: Role, mode: str, backend: str, push_problem: str | None
                    ) -> str | None:
    """Why pool ``role`` may not take KV mode ``mode`` on ``backend``, or None when it may.
    ``push_problem``: why this backend's engines cannot run push here (None: they can; it is
    read only for ``push``)."""
    if mode not in POOL_KV_MODES:
        return f"KV mode must be pull or push, got {mode!r}"
    if mode == "pull":
        return None
    if backend == "external":
        return EXTERNAL_PUSH_REFUSAL
    if push_problem is not None:
        return f"KV push for the {role.value} pool: {push_problem}"
    return None


def push_capability(settings: Settings) -> str | None:
    """Why the configured backend's engines cannot run KV push here, or None. The vLLM check
    runs the installed vLLM's import once (seconds), at the first push asked for."""
    if settings.backend == "vllm":
        return push_refusal(settings)
    return None
