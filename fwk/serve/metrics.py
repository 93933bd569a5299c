"""Prometheus metrics of one server. It has its own registry, so that two servers in one
process don't mix."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("model", "version")
        r = self.registry
        self.requests = Counter(
            "fwk_serve_requests", "inference requests answered, by HTTP status", (*labels, "code"), registry=r
        )
        self.batch_size = Histogram(
            "fwk_serve_batch_size", "rows per inference batch", labels, buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "fwk_serve_batch_requests", "requests merged per batch", labels, buckets=BATCH_BUCKETS, registry=r
        )
        self.queue_delay = Histogram(
            "fwk_serve_queue_delay_seconds",
            "from arrival to its batch's start",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference = Histogram(
            "fwk_serve_inference_seconds", "run time of one batch", labels, buckets=LATENCY_BUCKETS, registry=r
        )
        self.latency = Histogram(
            "fwk_serve_request_latency_seconds",
            "from the body read to the reply",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.refused = Counter(
            "fwk_serve_refused",
            "requests turned away by a bound (inflight, queue, deadline, body_timeout, warming) or their Host (host); "
            "connections closed before their headers were in (header_timeout, connections)",
            ("reason",),
            registry=r,
        )
        self.warmup = Counter(
            "fwk_serve_warmup_inferences",
            "warm-up inferences run before taking traffic",
            (*labels, "batch_size"),
            registry=r,
        )

    def on_batch(self, model: str, version: str):
        """Return the batcher's callback for one version, which records batch rows, requests
        merged and run seconds."""
        size, merged, infer = (
            self.batch_size.labels(model, version),
            self.batch_requests.labels(model, version),
            self.inference.labels(model, version),
        )

        def observe(rows: int, requests: int, seconds: float) -> None:
            size.observe(rows)
            merged.observe(requests)
            infer.observe(seconds)

        return observe

    def text(self) -> bytes:
        return generate_latest(self.registry)
