"""The controller's error hierarchy. Raised anywhere, mapped to HTTP once at the edge
(``controller.api``): the control API answers ``{"detail": ...}``, the data plane answers
OpenAI's ``{"error": {...}}``."""

from __future__ import annotations


class PdctlError(Exception):
    """Root of every error the controller raises on purpose."""

    status_code = 500


class ConfigError(PdctlError):
    """A configuration file or value is invalid; the message names the field and reason."""


class InvalidChange(PdctlError):
    """A requested change to the cluster is refused; nothing was changed."""

    status_code = 422

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


class NotFound(PdctlError):
    status_code = 404


class Unauthorized(PdctlError):
    status_code = 401


class LaunchError(PdctlError):
    """An instance could not be started."""


# ---- data plane ------------------------------------------------------------------------

class RoutingError(PdctlError):
    """A client request could not be served; carries the OpenAI error type and, for a
    client's mistake, the request field (``param``) it is about."""

    error_type = "server_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    @property
    def rejected(self) -> bool:
        """The request was refused (a client error or admission), not failed."""
        return 400 <= self.status_code < 500


class NoInstanceAvailable(RoutingError):
    status_code = 503
    error_type = "service_unavailable"


class BadRequest(RoutingError):
    status_code = 400
    error_type = "invalid_request_error"


class ModelNotFound(RoutingError):
    status_code = 404
    error_type = "invalid_request_error"


class RequestTimeout(RoutingError):
    """The client did not send its whole body in time."""

    status_code = 408
    error_type = "invalid_request_error"


class PayloadTooLarge(RoutingError):
    status_code = 413
    error_type = "invalid_request_error"


class UnsupportedMediaType(RoutingError):
    status_code = 415
    error_type = "invalid_request_error"


class Overloaded(RoutingError):
    """Admission control: more requests in flight than the configured limit. The client
    may retry after ``retry_after_s``."""

    status_code = 429
    error_type = "rate_limit_exceeded"
    retry_after_s = 1


class UpstreamUnreachable(RoutingError):
    """Connecting or talking to an engine failed before it answered (safe to retry)."""

    status_code = 502
    error_type = "upstream_unreachable"
