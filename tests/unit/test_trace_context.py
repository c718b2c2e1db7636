"""The client's W3C trace context, as the router forwards it to both hops."""

from __future__ import annotations

import pytest

from controller.router.request import trace_context

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(("traceparent", "tracestate", "forwarded"), [
    (TP, None, (("traceparent", TP),)),
    (f" {TP} ", "rojo=00f067aa0ba902b7", (("traceparent", TP),
                                           ("tracestate", "rojo=00f067aa0ba902b7"))),
    (None, "rojo=1", ()),  # a tracestate alone means nothing
    (TP.upper(), "rojo=1", ()),  # upper-case hex is malformed
    ("ff" + TP[2:], None, ()),  # version ff is invalid
    ("00-" + "0" * 32 + TP[35:], None, ()),  # all-zero trace id
    (TP[:36] + "0" * 16 + "-01", None, ()),  # all-zero parent id
    ("00-4bf92f35-00f067aa0ba902b7-01", None, ()),  # short trace id
    (TP + "-extra", None, ()),
    ("", None, ()),
])
def test_trace_context(traceparent: str | None, tracestate: str | None,
                       forwarded: tuple[tuple[str, str], ...]) -> None:
    assert trace_context(traceparent, tracestate) == forwarded


def test_tracing_without_the_otel_extra_is_a_clear_config_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from controller.errors import ConfigError
    from controller.router.tracing import RequestTracer

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                        None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"pip install 'pdctl\[otel\]'"):
        RequestTracer("http://127.0.0.1:4318/v1/traces")
