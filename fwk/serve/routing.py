"""Which version of a model serves a request: the stable one, or the canary for its share.

A request that names a version gets it. Otherwise the canary (when there is one) takes
``share`` of the traffic: a request with a client id always lands on the same side (a
hash of the id, not a coin), one without tosses a coin. Promote makes the canary the
stable version; rollback stops routing to it. Both only swap which version new requests
get: a request already queued or running finishes on the version it was given. With
auto-promote, once the canary has served N requests its error rate and p99 latency are
compared with the stable version's over the same window, and it is promoted or rolled back.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class VersionStats:
    """Counters of one version since the server started (latencies: the newest ``window``)."""

    window: int = 2048
    requests: int = 0
    errors: int = 0
    latencies: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.latencies = deque(maxlen=self.window)

    def add(self, seconds: float, ok: bool) -> None:
        self.requests += 1
        self.errors += 0 if ok else 1
        if ok:
            self.latencies.append(seconds)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def quantile_ms(self, q: float) -> float | None:
        return float(np.quantile(np.fromiter(self.latencies, float), q) * 1000) if self.latencies else None

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": self.error_rate,
            "p50_ms": self.quantile_ms(0.5),
            "p99_ms": self.quantile_ms(0.99),
        }


@dataclass(frozen=True)
class AutoPromote:
    """--auto-promote: decide after ``requests`` canary requests, within these bounds of the stable version."""

    requests: int
    max_error_delta: float
    max_p99_ratio: float


def sticky_share(model: str, client_id: str) -> float:
    """A client's fixed point in [0, 1): below the canary share, it is a canary client."""
    digest = hashlib.sha256(f"{model}\0{client_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class Router:
    """The versions of one model, its stable version, its canary and their counters."""

    def __init__(
        self,
        model: str,
        versions: list[str],
        stable: str,
        canary: str | None = None,
        share: float = 0.05,
        auto: AutoPromote | None = None,
        window: int = 2048,
        seed: int | None = None,
    ) -> None:
        self.model, self.versions, self.stable, self.canary, self.share = model, list(versions), stable, canary, share
        self.auto = auto if canary is not None else None
        self.stats = {v: VersionStats(window) for v in versions}
        self.decisions: list[dict[str, Any]] = []  # promotions and rollbacks, oldest first
        self._coin = random.Random(seed)

    def pick(self, client_id: str | None = None) -> str:
        if self.canary is None:
            return self.stable
        point = sticky_share(self.model, client_id) if client_id else self._coin.random()
        return self.canary if point < self.share else self.stable

    def record(self, version: str, seconds: float, ok: bool) -> dict[str, Any] | None:
        """Count a served request; with auto-promote, the decision it triggered (if any)."""
        self.stats[version].add(seconds, ok)
        if self.auto is not None and version == self.canary and self.stats[version].requests >= self.auto.requests:
            return self._decide()
        return None

    def _decide(self) -> dict[str, Any]:
        assert self.auto is not None and self.canary is not None
        new, old = self.stats[self.canary], self.stats[self.stable]
        err_ok = new.error_rate <= old.error_rate + self.auto.max_error_delta
        p99_new, p99_old = new.quantile_ms(0.99), old.quantile_ms(0.99)
        p99_ok = p99_new is not None and (p99_old is None or p99_new <= p99_old * self.auto.max_p99_ratio)
        fmt = lambda ms: "n/a" if ms is None else f"{ms:.2f} ms"  # noqa: E731
        why = (
            f"after {new.requests} canary requests: error rate {new.error_rate:.2%} vs {old.error_rate:.2%} "
            f"(bound +{self.auto.max_error_delta:.2%}), p99 {fmt(p99_new)} vs {fmt(p99_old)} "
            f"(bound x{self.auto.max_p99_ratio:g})"
        )
        return self.promote(why) if err_ok and p99_ok else self.rollback(why)

    def promote(self, why: str = "asked") -> dict[str, Any]:
        """The canary becomes the stable version; the old stable one stays loaded (by version)."""
        if self.canary is None:
            raise LookupError(f"model {self.model} has no canary to promote")
        decision = {"action": "promote", "from": self.stable, "to": self.canary, "why": why, "at": time.time()}
        self.stable, self.canary, self.auto = self.canary, None, None
        self.decisions.append(decision)
        return decision

    def rollback(self, why: str = "asked") -> dict[str, Any]:
        """Stop routing to the canary; it stays loaded (reachable by version)."""
        if self.canary is None:
            raise LookupError(f"model {self.model} has no canary to roll back")
        decision = {"action": "rollback", "from": self.canary, "to": self.stable, "why": why, "at": time.time()}
        self.canary, self.auto = None, None
        self.decisions.append(decision)
        return decision

    def state(self) -> dict[str, Any]:
        return {
            "stable": self.stable,
            "canary": self.canary,
            "canary_share": self.share if self.canary else 0.0,
            "auto_promote": None if self.auto is None else vars(self.auto) | {},
            "versions": {v: self.stats[v].summary() for v in self.versions},
            "decisions": self.decisions,
        }
