"""The console's client of the controller: ``pdctl_api``'s typed client, acting as
``pdctl-console`` in the audit log, with the reads the console needs beyond it
(``/api/v1/cache``). No Streamlit here.

Every failure is ``pdctl_api.client.ApiError``, carrying the HTTP status (``None`` when the
controller could not be reached or no token was found) and the API's ``detail`` verbatim.
"""

from __future__ import annotations

import httpx
from pydantic import TypeAdapter

from pdctl_api.client import ApiError, PdctlClient
from pdctl_api.schema import CachePublic

ACTOR = "pdctl-console"
_CACHE = TypeAdapter(CachePublic)

__all__ = ["ACTOR", "ApiError", "ControllerClient"]


class ControllerClient(PdctlClient):
    """One controller, one token. ``transport`` lets tests put a fake controller behind it."""

    def __init__(self, base_url: str, token: str | None, timeout_s: float = 5.0,
                 transport: httpx.BaseTransport | None = None, actor: str = ACTOR) -> None:
        super().__init__(base_url, token, actor=actor, timeout_s=timeout_s,
                         transport=transport)

    def cache(self, window_s: float = 300.0, step_s: float = 10.0,
              end: float | None = None) -> CachePublic:
        """``GET /api/v1/cache``: the prefix cache over the window (hit rate reported and
        predicted, drift, tokens and decode KV bytes saved, each instance's block index) in
        ``step_s`` buckets; ``end`` (unix s): a window that ended then. Fails as every read
        does (``ApiError``; 404 from a controller older than the route)."""
        params = {"window_s": window_s, "step_s": step_s}
        if end is not None:
            params["end"] = end
        return self._call(_CACHE, "GET", "/cache", params)
