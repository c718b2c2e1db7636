"""One instance's capacity in tokens per second, read from the planner's performance profile
the way the planner sizes pools with it (``decide.size_prefill``/``size_decode``): prompt
tokens/s at a prompt length, and the output tokens/s of the best concurrency whose ITL meets
the planner's target at a context length, the KV cache's room included; with its basis in
words, or why there is none (never a made-up one). Profiles are in modelled time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from controller.models import Role
from controller.planner.profile import PerfProfile


@dataclass(frozen=True)
class TokenCapacity:
    """One instance's capacity (modelled tokens/s) and its basis in words."""

    basis: str
    profile: str | None = None
    prompt_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None
    prompt_tokens: float | None = None
    context_tokens: float | None = None
    reason: str | None = None

    def public(self) -> dict[str, Any]:
        return asdict(self)


def no_capacity(reason: str, profile: str | None = None) -> TokenCapacity:
    return TokenCapacity(f"no capacity: {reason}", profile, reason=reason)


def profile_capacity(prof: PerfProfile, role: Role, prompt_tokens: float,
                     context_tokens: float, itl_ms: float) -> TokenCapacity:
    """A prefill instance's prompt tokens/s at ``prompt_tokens``; a decode instance's output
    tokens/s at ``context_tokens`` under the ``itl_ms`` target (and its colocated prompts'
    tokens/s at ``prompt_tokens``), as the planner reads the profile."""
    _, prompt = prof.prefill_at(prompt_tokens)
    prompt_words = f"{prompt:,.0f} prompt tokens/s at {prompt_tokens:,.0f}-token prompts"
    if role is Role.PREFILL:
        return TokenCapacity(f"profile {prof.key}: {prompt_words}", prof.key, prompt, None,
                             prompt_tokens)
    choice = prof.decode_best(context_tokens, itl_ms)
    if choice is None:  # the planner's fallback: one sequence at a time
        low = min(prof.decode, key=lambda p: (p.concurrency, -p.context_tokens))
        output = low.tokens_per_s
        how = (f"no concurrency meets the {itl_ms:,.0f} ms ITL target at {context_tokens:,.0f}"
               f"-token contexts: one sequence's {output:,.0f} output tokens/s")
    else:
        output = choice.tokens_per_s
        how = (f"{output:,.0f} output tokens/s at concurrency {choice.concurrency} (ITL "
               f"{choice.itl_ms:.1f} ms within the {itl_ms:,.0f} ms target"
               f"{', the KV cache capping the concurrency' if choice.kv_bound else ''}) at "
               f"{context_tokens:,.0f}-token contexts")
    return TokenCapacity(f"profile {prof.key}: {how}; its colocated prompts against "
                         f"{prompt_words}", prof.key, prompt, output, prompt_tokens,
                         context_tokens)


CapacityOf = Callable[[Role, int | None, float, float], TokenCapacity]


def profile_capacities(find: Callable[[int], PerfProfile | None], key: Callable[[int], str],
                       itl_ms: float, why_none: str | None = None) -> CapacityOf:
    """``capacity(role, tp, prompt tokens, context tokens)`` from the profiles ``find(tp)``
    gives (``key(tp)`` names the one looked for); ``why_none``: no profile can apply."""
    def capacity(role: Role, tp: int | None, prompt: float, context: float) -> TokenCapacity:
        if why_none is not None:
            return no_capacity(why_none)
        if tp is None:
            return no_capacity("its TP is unknown (the controller no longer knows it)")
        prof = find(tp)
        if prof is None:
            return no_capacity(f"no performance profile {key(tp)} (`pdctl profile` measures "
                               "one; planner.profile_dir adds it)", key(tp))
        return profile_capacity(prof, role, prompt, context, itl_ms)
    return capacity
