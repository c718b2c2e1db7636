"""OpenTelemetry traces of client requests (``controller.otlp_traces_endpoint``; the ``otel``
extra): one span per request, from its arrival to its end, a child of the client's W3C trace
context when it sent one, with the TTFT parts (queue, prefill, KV transfer, decode
scheduling) as child spans laid end to end from the arrival; exported in batches over
OTLP/HTTP by a background thread of the OpenTelemetry SDK.

The request's span starts when the request arrives, so both engine hops carry *its* context
(``traceparent`` with the router's span as the parent: vLLM started with
``--otlp-traces-endpoint`` parents its own spans on it). With no endpoint configured nothing
here is imported or run: the router forwards the client's trace context as it came.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from controller.errors import ConfigError
from controller.models import RequestRecord

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("pdctl.tracing")

OTEL_EXTRA = ("controller.otlp_traces_endpoint needs OpenTelemetry's SDK and OTLP exporter: "
              "pip install 'pdctl[otel]'")
# The TTFT parts as child spans, in the order they happen (the record's fields, in ms).
SPAN_PARTS = (("queue", "queue_ms"), ("prefill", "prefill_ms"), ("kv_transfer", "transfer_ms"),
              ("decode_scheduling", "decode_sched_ms"))


class TracingUnavailable(ConfigError):
    """Tracing was asked for without the ``otel`` extra installed."""


class RequestTracer:
    """Spans of client requests, exported to ``endpoint`` (OTLP/HTTP, protobuf)."""

    def __init__(self, endpoint: str, service_name: str = "pdctl") -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError as exc:
            raise TracingUnavailable(f"{OTEL_EXTRA} ({exc})") from None
        self.endpoint = endpoint
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self._tracer = self._provider.get_tracer("pdctl.router")
        self._propagator = TraceContextTextMapPropagator()

    def start(self, endpoint: str, trace: tuple[tuple[str, str], ...], start_ns: int
              ) -> tuple[Span, tuple[tuple[str, str], ...]]:
        """The request's span (a child of the client's context ``trace``, when given) and
        the trace context its hops carry (the span as their parent)."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        parent = self._propagator.extract(dict(trace)) if trace else None
        span = self._tracer.start_span(f"POST {endpoint}", context=parent,
                                       kind=SpanKind.SERVER, start_time=start_ns)
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=set_span_in_context(span))
        return span, tuple(carrier.items())

    def end(self, span: Span, rec: RequestRecord, start_ns: int) -> None:
        """End the request's span with what its record says, and add the TTFT parts."""
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        attrs: dict[str, Any] = {
            "pdctl.request_id": rec.id, "pdctl.path": rec.path.value,
            "pdctl.status": rec.status, "pdctl.stream": rec.stream,
            "gen_ai.usage.input_tokens": rec.prompt_tokens,
            "gen_ai.usage.output_tokens": rec.output_tokens,
            "pdctl.ttft_ms": rec.ttft_ms, "pdctl.retries": rec.retries}
        for key, value in (("pdctl.prefill_instance", rec.prefill_instance),
                           ("pdctl.decode_instance", rec.decode_instance),
                           ("pdctl.decision", rec.decision),
                           ("pdctl.decision_reason", rec.decision_reason)):
            if value is not None:
                attrs[key] = value
        span.set_attributes(attrs)
        if rec.status == "error":
            span.set_status(Status(StatusCode.ERROR, rec.error or "error"))
        end_ns = start_ns + int(rec.e2e_ms * 1e6)
        if rec.status == "ok":
            context = set_span_in_context(span)
            at = start_ns
            for name, field in SPAN_PARTS:
                ms = float(getattr(rec, field))
                if ms <= 0:
                    continue
                part_end = min(at + int(ms * 1e6), end_ns)
                self._tracer.start_span(name, context=context, start_time=at).end(
                    end_time=part_end)
                at = part_end
        span.end(end_time=max(end_ns, start_ns))

    def close(self) -> None:
        """Export what is left and stop the exporter's thread."""
        try:
            self._provider.shutdown()
        except Exception:  # an unreachable collector must not stop the controller's exit
            log.warning("could not flush request spans to %s", self.endpoint, exc_info=True)
