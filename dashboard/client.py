"""Typed REST client of the controller's control API (``/api/v1``); no Streamlit here.

Every failure is one exception type, ``ApiError``, carrying the HTTP status (``None`` when the
controller could not be reached or no token was found) and the API's ``detail`` verbatim.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

import httpx

Json = dict[str, Any]
Role = Literal["prefill", "decode"]
ACTOR = "pdctl-console"


class ApiError(Exception):
    """A control-API call that did not succeed.

    ``status`` is the HTTP status, or ``None`` when no answer came (unreachable controller,
    timeout) or there was no token to send. ``detail`` is the API's ``detail`` field as sent.
    """

    def __init__(self, status: int | None, detail: str, url: str = "") -> None:
        super().__init__(f"{status}: {detail}" if status else detail)
        self.status = status
        self.detail = detail
        self.url = url

    @property
    def unreachable(self) -> bool:
        return self.status is None

    @property
    def unauthorized(self) -> bool:
        return self.status == 401

    @property
    def refused(self) -> bool:
        """The controller understood the change and refused it (nothing was changed)."""
        return self.status in (400, 404, 409, 422)


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        return detail if isinstance(detail, str) else str(detail)
    return response.text


class ControllerClient:
    """One controller, one token. ``transport`` lets tests put a fake controller behind it."""

    def __init__(self, base_url: str, token: str | None, timeout_s: float = 5.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        # Distinguishes clients in shared caches (two tests, two controllers, one URL).
        self.cache_key = f"{self.base_url}#{uuid.uuid4().hex[:8]}"
        headers = {"X-Pdctl-Actor": ACTOR}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers,
                                  timeout=httpx.Timeout(timeout_s, connect=2.0),
                                  transport=transport)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, params: Json | None = None,
              body: Json | None = None) -> Any:
        if not self.token:
            raise ApiError(None, "no API token", self.base_url)
        try:
            r = self._http.request(method, f"/api/v1{path}", params=params, json=body)
        except httpx.HTTPError as exc:
            raise ApiError(None, f"{type(exc).__name__}: {exc}", self.base_url) from None
        if r.status_code >= 400:
            raise ApiError(r.status_code, _detail(r), self.base_url)
        try:
            return r.json()
        except ValueError:
            raise ApiError(r.status_code, f"not JSON: {r.text[:200]}", self.base_url) from None

    # ---- reads -------------------------------------------------------------------------

    def cluster(self) -> Json:
        result: Json = self._call("GET", "/cluster")
        return result

    def routing(self) -> Json:
        result: Json = self._call("GET", "/routing")
        return result

    def stats(self, window_s: float) -> Json:
        result: Json = self._call("GET", "/stats", {"window_s": window_s})
        return result

    def timeseries(self, window_s: float, step_s: float) -> Json:
        result: Json = self._call("GET", "/timeseries",
                                  {"window_s": window_s, "step_s": step_s})
        return result

    def requests(self, limit: int) -> list[Json]:
        result: list[Json] = self._call("GET", "/requests", {"limit": limit})
        return result

    def advisor(self, window_s: float = 600.0) -> Json:
        result: Json = self._call("GET", "/advisor", {"window_s": window_s})
        return result

    def events(self, limit: int = 200, kind: str | None = None) -> list[Json]:
        params: Json = {"limit": limit}
        if kind:
            params["kind"] = kind
        result: list[Json] = self._call("GET", "/events", params)
        return result

    # ---- changes -----------------------------------------------------------------------

    def set_pool(self, role: Role, size: int | None = None, tp: int | None = None) -> Json:
        body = {k: v for k, v in (("size", size), ("tp", tp)) if v is not None}
        result: Json = self._call("PATCH", f"/pools/{role}", body=body)
        return result

    def set_routing(self, patch: Json) -> Json:
        result: Json = self._call("PATCH", "/routing", body=patch)
        return result

    def drain(self, instance_id: str) -> Json:
        result: Json = self._call("POST", f"/instances/{instance_id}/drain")
        return result
