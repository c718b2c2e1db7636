"""The controller's logs: text (default) or one JSON object per line (``--log-format json``),
both with dated timestamps; a line written while a client request is served carries its
request id and, when the client sent a W3C trace context, its trace id (set once per request
in a context variable, so every log call in the request's task tree has them)."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

# (request id, trace id or None) of the client request being served in this context.
REQUEST: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
    "pdctl_request", default=None)


def bind_request(request_id: str, trace: tuple[tuple[str, str], ...]) -> None:
    """Name the client request served from here on in this context (its task tree)."""
    trace_id = None
    for name, value in trace:
        if name == "traceparent":
            trace_id = value[3:35]
    REQUEST.set((request_id, trace_id))


def _iso(created: float) -> str:
    ms = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{ms:03d}Z"


class TextFormatter(logging.Formatter):
    """``2026-12-04T15:09:16.123Z WARNING pdctl.router: message [request=... trace=...]``"""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_iso(record.created)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        bound = REQUEST.get()
        if bound is not None:
            line += f" [request={bound[0]}" + (f" trace={bound[1]}]" if bound[1] else "]")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    ``request_id`` and ``trace_id`` when serving a request, ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {"ts": _iso(record.created), "level": record.levelname,
                                  "logger": record.name, "message": record.getMessage()}
        bound = REQUEST.get()
        if bound is not None:
            out["request_id"] = bound[0]
            if bound[1]:
                out["trace_id"] = bound[1]
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def log_format() -> LogFormat:
    """The format ``setup_logging`` gave the process (a router worker logs in the same)."""
    handlers = logging.getLogger().handlers
    json = any(isinstance(h.formatter, JsonFormatter) for h in handlers)
    return "json" if json else "text"


def setup_logging(level: str, fmt: LogFormat = "text") -> None:
    """The process's logging: ``level`` and ``fmt`` on stderr (uvicorn's own loggers too)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.getLogger("httpx").setLevel(logging.WARNING)
    for name in ("uvicorn", "uvicorn.error"):  # through the root handler, in this format
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
