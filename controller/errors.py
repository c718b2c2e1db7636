"""The controller's error hierarchy. Raised anywhere, mapped to HTTP once at the edge
(``controller.api``): the control API answers ``{"detail": ...}``, the data plane answers
OpenAI's ``{"error": {...}}``."""

from __future__ import annotations

from typing import Any


class PdctlError(Exception):
    """Root of every error the controller raises on purpose. A subclass names its HTTP status
    in its class line (``class NotFound(PdctlError, status=404)``)."""

    status_code = 500

    def __init_subclass__(cls, status: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status_code = status


class ConfigError(PdctlError):
    """A configuration file or value is invalid; the message names the field and reason."""


class InvalidChange(PdctlError, status=422):
    """A requested change to the cluster is refused; nothing was changed."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


class NotFound(PdctlError, status=404):
    """No such instance, or request among those recorded."""


class Unpredictable(PdctlError, status=409):
    """A what-if prediction cannot be made now (no profile for the fleet's model, too few
    recent requests); nothing was kept."""


class StateUnwritable(PdctlError, status=503):
    """The state directory cannot be written (full, read-only): an operator's change that
    must be persisted and recorded is not made."""


class Busy(PdctlError, status=429):
    """The same expensive work (a what-if's simulations) is running for another caller;
    nothing was done: retry when it ends."""


class Unauthorized(PdctlError, status=401):
    """A missing or invalid bearer token."""


class LaunchError(PdctlError):
    """An instance could not be started."""


# ---- data plane ------------------------------------------------------------------------

class RoutingError(PdctlError):
    """A client request could not be served; carries the OpenAI error type and, for a
    client's mistake, the request field (``param``) it is about. A subclass names its status
    and error type in its class line."""

    error_type = "server_error"

    def __init_subclass__(cls, error_type: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if error_type is not None:
            cls.error_type = error_type

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    @property
    def rejected(self) -> bool:
        """The request was refused (a client error or admission), not failed."""
        return 400 <= self.status_code < 500


class NoInstanceAvailable(RoutingError, status=503, error_type="service_unavailable"):
    """No ready instance could take the request."""


class BadRequest(RoutingError, status=400, error_type="invalid_request_error"):
    """A malformed request: its JSON, or a field the router reads or the engines limit."""


class ModelNotFound(RoutingError, status=404, error_type="invalid_request_error"):
    """``model`` names no model this controller serves."""


class RequestTimeout(RoutingError, status=408, error_type="invalid_request_error"):
    """The client did not send its whole body in time."""


class PayloadTooLarge(RoutingError, status=413, error_type="invalid_request_error"):
    """A body over ``controller.max_body_bytes``."""


class UnsupportedMediaType(RoutingError, status=415, error_type="invalid_request_error"):
    """A body not sent as ``application/json``."""


class Overloaded(RoutingError, status=429, error_type="rate_limit_exceeded"):
    """Admission control: more requests in flight than the configured limit. The client
    may retry after ``retry_after_s``."""

    retry_after_s = 1


class InvalidApiKey(RoutingError, status=401, error_type="invalid_request_error"):
    """The data plane's API key (``controller.api_key``) is on and the request did not send
    it as ``Authorization: Bearer <key>``."""


class UpstreamUnreachable(RoutingError, status=502, error_type="upstream_unreachable"):
    """Connecting or talking to an engine failed before it answered (safe to retry)."""
