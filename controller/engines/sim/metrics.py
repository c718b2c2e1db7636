"""The engine's Prometheus metrics, under vLLM's own names, in a registry per app.

Names, types and the ``model_name`` label follow vLLM so dashboards and the controller read
a simulated engine exactly like a real one. A registry per app (never the global one) lets
many engines live in one process, as they do in tests.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_XFER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0)
_BYTES_BUCKETS = tuple(float(2**k) for k in range(16, 38, 2))  # 64 KiB .. 128 GiB
_DESCRIPTOR_BUCKETS = tuple(float(2**k) for k in range(0, 18))


class SimMetrics:
    """Every metric of one engine, bound to its ``model_name`` label once."""

    def __init__(self, model_name: str) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            # prometheus_client appends ``_total`` to counter names itself.
            return Counter(name.removesuffix("_total"), doc, labels, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting, including those "
                             "waiting for remote KV.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Share of KV cache blocks in use (0-1).")
        self.prompt_tokens = counter("vllm:prompt_tokens_total", "Prompt tokens processed.")
        # prometheus_client's process collector as vLLM's API server exports it (no labels):
        # here the engine's own start, as if it were the only one in its process
        started = Gauge("process_start_time_seconds",
                        "Start time of the process since unix epoch in seconds.", registry=r)
        started.set(time.time())
        # The simulator's own: how far its wall time fell behind its model (the machine could
        # not keep up: its latencies then say more about this CPU than the modelled one).
        self.busy = counter("pdctl_sim_busy_seconds_total",
                            "Wall seconds of engine steps as modelled (x time_scale)")
        self.lag = counter("pdctl_sim_lag_seconds_total",
                           "Wall seconds the engine loop ran behind its modelled clock")
        # In tokens, as vLLM counts them: each request's prompt when first looked up, and
        # the leading tokens of it found in this engine's prefix cache.
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries_total",
                                            "Prefix cache queries, in tokens.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits_total",
                                         "Prefix cache hits, in tokens.")
        self.generation_tokens = counter("vllm:generation_tokens_total", "Tokens generated.")
        self.failed_transfers = counter("vllm:nixl_num_failed_transfers_total",
                                        "KV pulls that failed (decode side).")
        self.expired_kv = counter("vllm:nixl_num_kv_expired_reqs_total",
                                  "Prefill KV handles freed unread when their lease expired "
                                  "(prefill side).")
        self.notifications_after_expiry = counter(
            "vllm:nixl_num_notifications_after_expiry_total",
            "Reads or releases of KV handles this prefill no longer tracks, usually because "
            "their lease expired: the blocks may have been reused (prefill side).")
        success = Counter("vllm:request_success", "Requests finished.",
                          ["model_name", "finished_reason"], registry=r)
        self.success_length = success.labels(model_name, "length")
        by_source = Counter("vllm:prompt_tokens_by_source", "Prompt tokens by where their KV "
                            "came from.", ["model_name", "source"], registry=r)
        self.prompt_local = by_source.labels(model_name, "local_compute")
        self.prompt_cache_hit = by_source.labels(model_name, "local_cache_hit")
        self.prompt_external = by_source.labels(model_name, "external_kv_transfer")
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Arrival to first token.", _LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Arrival to first "
                                    "scheduled (includes waiting for remote KV).",
                                    _LATENCY_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "First scheduled to first token.", _LATENCY_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds",
                                     "First token to last token.", _LATENCY_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between tokens.",
                             _ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.",
                             _LATENCY_BUCKETS)
        self.xfer_time = histogram("vllm:nixl_xfer_time_seconds", "KV transfer time of a pull.",
                                   _XFER_BUCKETS)
        self.post_time = histogram("vllm:nixl_post_time_seconds", "Time to post a pull (the "
                                   "handshake with the prefill engine).", _XFER_BUCKETS)
        self.bytes_transferred = histogram("vllm:nixl_bytes_transferred", "KV bytes per pull.",
                                           _BYTES_BUCKETS)
        self.descriptors = histogram("vllm:nixl_num_descriptors", "KV blocks per pull.",
                                     _DESCRIPTOR_BUCKETS)

    def render(self, running: int, waiting: int, kv_usage: float) -> bytes:
        """Prometheus text exposition, with the gauges set to the given scheduler state."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        return generate_latest(self.registry)
