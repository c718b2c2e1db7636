"""The console's client of the controller: ``pdctl_api``'s typed client, acting as
``pdctl-console`` in the audit log. No Streamlit here.

Every failure is ``pdctl_api.client.ApiError``, carrying the HTTP status (``None`` when the
controller could not be reached or no token was found) and the API's ``detail`` verbatim.
"""

from __future__ import annotations

import httpx

from pdctl_api.client import ApiError, PdctlClient

ACTOR = "pdctl-console"

__all__ = ["ACTOR", "ApiError", "ControllerClient"]


class ControllerClient(PdctlClient):
    """One controller, one token. ``transport`` lets tests put a fake controller behind it."""

    def __init__(self, base_url: str, token: str | None, timeout_s: float = 5.0,
                 transport: httpx.BaseTransport | None = None, actor: str = ACTOR) -> None:
        super().__init__(base_url, token, actor=actor, timeout_s=timeout_s,
                         transport=transport)
