"""A metric card as data: what a section's row of ``st.metric`` cards shows, decided by pure
functions (``dashboard.prefix_cache.cache_cards``, ``dashboard.handoff.handoff_cards``) that
tests assert, and drawn by ``dashboard.ui``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    """One metric card: label, value, and the grey line under it (``delta``, not coloured)."""

    label: str
    value: str
    delta: str | None = None
    help: str | None = None
