"""Log lines as the controller writes them: dated UTC timestamps in both formats, and the
request and trace ids of the client request a line is about."""

from __future__ import annotations

import contextvars
import json
import logging
import re

from controller.obs.logs import JsonFormatter, TextFormatter, bind_request

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("pdctl.router", logging.WARNING, __file__, 1, msg, (), None)


def test_text_and_json_lines_outside_and_inside_a_request() -> None:
    text, js = TextFormatter(), JsonFormatter()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING pdctl\.router: hi",
                        text.format(record("hi")))
    assert "request_id" not in json.loads(js.format(record("hi")))

    def inside() -> tuple[str, dict[str, str]]:
        bind_request("req-1", (("traceparent", TP),))
        return text.format(record("slow")), json.loads(js.format(record("slow")))

    line, obj = contextvars.copy_context().run(inside)
    assert line.endswith("slow [request=req-1 trace=4bf92f3577b34da6a3ce929d0e0e4736]")
    assert obj["request_id"] == "req-1" and obj["trace_id"] == TP[3:35]
    assert obj["message"] == "slow" and obj["level"] == "WARNING"

    def untraced() -> str:
        bind_request("req-2", ())
        return text.format(record("x"))

    assert contextvars.copy_context().run(untraced).endswith("x [request=req-2]")
