"""The ``serve`` config group: composed on its own (Hydra grammar), typed, range-checked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fwk.config.schema import ServeConfig
from fwk.errors import UserError


def _rules(c: ServeConfig) -> Iterator[tuple[bool, str, Any, str]]:
    yield c.max_batch_size >= 1, "serve.max_batch_size", c.max_batch_size, "an integer >= 1 (1 = batching off)"
    yield c.max_delay_ms >= 0, "serve.max_delay_ms", c.max_delay_ms, "a number of milliseconds >= 0"
    yield c.warmup >= 0, "serve.warmup", c.warmup, "an integer >= 0"
    yield c.threads >= 0, "serve.threads", c.threads, "an integer >= 0 (0 = the cores this process may use)"
    yield c.intra_op_threads >= 0, "serve.intra_op_threads", c.intra_op_threads, "an integer >= 0"
    yield 0 < c.canary_share < 1, "serve.canary_share", c.canary_share, "a share of traffic in (0, 1)"
    yield c.auto_promote_requests >= 1, "serve.auto_promote_requests", c.auto_promote_requests, "an integer >= 1"
    yield (
        c.auto_promote_max_error_delta >= 0,
        "serve.auto_promote_max_error_delta",
        c.auto_promote_max_error_delta,
        "a share >= 0",
    )
    yield c.auto_promote_max_p99_ratio > 0, "serve.auto_promote_max_p99_ratio", c.auto_promote_max_p99_ratio, "> 0"
    yield c.max_body_mb > 0, "serve.max_body_mb", c.max_body_mb, "a number of MiB > 0"
    yield c.max_request_rows >= 1, "serve.max_request_rows", c.max_request_rows, "an integer >= 1"
    rows = "an integer >= serve.max_request_rows (a request must fit the queue)"
    yield c.max_queue_rows >= c.max_request_rows, "serve.max_queue_rows", c.max_queue_rows, rows
    yield c.max_inflight >= 1, "serve.max_inflight", c.max_inflight, "an integer >= 1"
    yield c.request_timeout_s > 0, "serve.request_timeout_s", c.request_timeout_s, "a number of seconds > 0"
    yield c.body_timeout_s > 0, "serve.body_timeout_s", c.body_timeout_s, "a number of seconds > 0"
    yield c.drain_s >= 0, "serve.drain_s", c.drain_s, "a number of seconds >= 0"
    yield c.latency_window >= 10, "serve.latency_window", c.latency_window, "an integer >= 10"


def load_settings(overrides: list[str]) -> ServeConfig:
    """conf/serve/<option>.yaml with the user's overrides; UserError naming a bad key or value."""
    from fwk.config.compose import compose_group

    cfg = ServeConfig(**compose_group("serve", ServeConfig, overrides))
    check_settings(cfg)
    return cfg


def check_settings(cfg: ServeConfig) -> ServeConfig:
    for ok, key, value, allowed in _rules(cfg):
        if not ok:
            raise UserError(f"{key}={value!r} is not allowed: expected {allowed} (fix it with {key}=...)")
    return cfg


def inference_threads(cfg: ServeConfig) -> int:
    """Batches run at once: serve.threads, else the cores this process may use."""
    import os

    if cfg.threads:
        return cfg.threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)
