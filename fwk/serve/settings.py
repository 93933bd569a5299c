"""The ``serve`` config group: its schema, composed on its own with Hydra's grammar, typed and
range-checked."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fwk.errors import UserError
from fwk.registry import doc


@dataclass
class ServeConfig:
    """The settings of `fwk serve` (conf/serve/): batching, warm-up, threads, canary rollout
    and request limits.

    Not part of ``Config``: like ``export``, composed on its own (``serve=OPTION``,
    ``serve.KEY=VALUE``); only fwk/serve/ reads it.
    """

    name: str = doc("default", "name of the option in conf/serve/")
    max_batch_size: int = doc(32, "rows per inference batch at most; 1 = batching off (each request runs alone)")
    max_delay_ms: float = doc(
        5.0,
        "longest a batch waits for more requests after its oldest one arrived, in ms; the wait is also "
        "capped by the measured run time of a batch of the current size (adaptive)",
    )
    adaptive: bool = doc(True, "cap the wait by the measured run time per batch size (false: always max_delay_ms)")
    warmup: int = doc(2, "warm-up inferences at each batch size 1..max_batch_size before a version takes traffic")
    threads: int = doc(0, "inference threads (batches run at once); 0 = the cores this process may use")
    intra_op_threads: int = doc(
        1,
        "threads inside one inference (onnxruntime's; torch's for pt2 and aoti exports); 1 with a thread per core "
        "avoids oversubscribing the cores",
    )
    canary_share: float = doc(0.05, "share of a model's traffic routed to its canary version (--canary), in (0, 1)")
    auto_promote_requests: int = doc(1000, "--auto-promote: decide after this many requests served by the canary")
    auto_promote_max_error_delta: float = doc(
        0.01, "--auto-promote: promote only if canary error rate <= stable's + this (a share, 0.01 = 1 point)"
    )
    auto_promote_max_p99_ratio: float = doc(
        1.5, "--auto-promote: promote only if canary p99 latency <= stable's p99 x this ratio"
    )
    max_body_mb: float = doc(16.0, "largest accepted request body, in MiB (larger: 413 with a JSON error)")
    max_request_rows: int = doc(
        256, "rows one request may carry; above max_batch_size it runs as several batches; above this: 413"
    )
    max_queue_rows: int = doc(
        1024, "rows waiting per model version; a request that would queue more gets 503 with Retry-After"
    )
    max_inflight: int = doc(128, "inference requests in the server at once; more get 503 with Retry-After")
    request_timeout_s: float = doc(
        30.0, "a request not answered within this (queue and run) gets 504; its batch is dropped if nobody waits"
    )
    body_timeout_s: float = doc(10.0, "a request body not fully received within this gets 408")
    header_timeout_s: float = doc(
        10.0,
        "a connection whose request headers are not complete within this, from its opening or from the first byte "
        "after its last response, gets 408 and is closed",
    )
    max_connections: int = doc(
        1024,
        "open connections at most; a request arriving past it gets 503 (health checks excepted); past it plus an "
        "eighth, a new connection closes the one waiting longest for its headers",
    )
    allowed_hosts: list[str] = doc(
        [],
        "Host header names answered (no port; .example.com: it and its subdomains; *: any); empty: localhost, "
        "127.0.0.1 and ::1 when --host is a loopback address, else any; others get 421 (health checks excepted)",
    )
    admin_token: str = doc(
        "auto",
        "bearer token that promote and rollback require (Authorization: Bearer TOKEN); auto: made at start and "
        "printed once; empty: those endpoints are off",
    )
    drain_s: float = doc(30.0, "on SIGTERM: seconds to let in-flight requests finish before exiting")
    latency_window: int = doc(2048, "latest requests per version kept for the p50/p99 figures (stats, auto-promote)")


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
    yield c.header_timeout_s > 0, "serve.header_timeout_s", c.header_timeout_s, "a number of seconds > 0"
    conns = f"an integer >= serve.max_inflight={c.max_inflight} (each request in flight holds a connection)"
    yield c.max_connections >= c.max_inflight, "serve.max_connections", c.max_connections, conns
    hosts = "a list of host names without scheme or port, like [localhost,api.example.com]; [*] for any"
    yield all(_host_entry(h) for h in c.allowed_hosts), "serve.allowed_hosts", c.allowed_hosts, hosts
    yield c.drain_s >= 0, "serve.drain_s", c.drain_s, "a number of seconds >= 0"
    yield c.latency_window >= 10, "serve.latency_window", c.latency_window, "an integer >= 10"


def _host_entry(name: Any) -> bool:
    """A host name or address as the Host header carries it, less the port: no scheme, path,
    user or space, and an IPv6 address without brackets."""
    if not isinstance(name, str) or not name or name.startswith("[") or any(c in name for c in "/@ \t"):
        return False
    return name.count(":") != 1  # one colon is a port; IPv6 addresses have two or more


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(cfg: ServeConfig, bound: str) -> frozenset[str] | None:
    """The Host names the server answers to; None: any. Unset, a server bound to a loopback
    address answers only to the loopback names: a web page of another site can resolve its own
    name to 127.0.0.1 (DNS rebinding), and its requests then carry that name. A server bound
    to every interface is reached under names fwk cannot know, so it answers any unless told."""
    import ipaddress

    if cfg.allowed_hosts:
        names = {h.lower().rstrip(".") for h in cfg.allowed_hosts}
        return None if "*" in names else frozenset(names)
    try:
        loopback = bound == "localhost" or ipaddress.ip_address(bound).is_loopback
    except ValueError:  # a host name: the names it is reached by are the user's to list
        loopback = False
    return frozenset(LOOPBACK_HOSTS) if loopback else None


def load_settings(overrides: list[str]) -> ServeConfig:
    """Compose conf/serve/<option>.yaml with the user's overrides. Raise a UserError naming a
    bad key or value."""
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
    """Return how many batches run at once: serve.threads, else the cores this process may use."""
    import os

    if cfg.threads:
        return cfg.threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)
