"""Which version of a model serves a request: the stable one, or the canary for its share.

A request that names a version gets it. Otherwise the canary (when there is one) takes
``share`` of the traffic: a request with a client id always lands on the same side (a
hash of the id, not a coin), one without tosses a coin. Promote makes the canary the
stable version; rollback stops routing to it. Both only swap which version new requests
get: a request already queued or running finishes on the version it was given.

With auto-promote, only the traffic the router assigned counts (a request that names its
version chose it; it could steer the decision): once the canary has served N such
requests, and the stable version has latencies of its own (``MIN_STABLE``) over the same
span of time, their error rates and p99 latencies over that span are compared, and the
canary is promoted or rolled back.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIN_STABLE = 100  # auto-promote: the stable version's own answered requests over the canary's span, at least
_TRIAL_KEPT = 100_000  # auto-promote: samples kept per version (the stable one gets 1/share times the canary's)


class Window:
    """The newest ``size`` requests of one version, as (time, seconds, ok)."""

    def __init__(self, size: int) -> None:
        self.rows: deque[tuple[float, float, bool]] = deque(maxlen=size)

    def add(self, t: float, seconds: float, ok: bool) -> None:
        self.rows.append((t, seconds, ok))

    def since(self, t0: float) -> list[tuple[float, float, bool]]:
        return [r for r in self.rows if r[0] >= t0]


def error_rate(rows: list[tuple[float, float, bool]]) -> float:
    return sum(not ok for _, _, ok in rows) / len(rows) if rows else 0.0


def p_ms(rows: list[tuple[float, float, bool]], q: float) -> float | None:
    """Return the ``q`` quantile of the answered requests' latencies, in ms. Return None when
    there are none."""
    good = [s for _, s, ok in rows if ok]
    return float(np.quantile(np.asarray(good), q) * 1000) if good else None


@dataclass
class VersionStats:
    """Counters of one version since the server started, and its newest ``window`` requests.
    The error rate and latencies are the window's."""

    window: int = 2048
    requests: int = 0
    errors: int = 0
    recent: Window = field(init=False)

    def __post_init__(self) -> None:
        self.recent = Window(self.window)

    def add(self, seconds: float, ok: bool, t: float) -> None:
        self.requests += 1
        self.errors += 0 if ok else 1
        self.recent.add(t, seconds, ok)

    def summary(self) -> dict[str, Any]:
        rows = list(self.recent.rows)
        return {
            "requests": self.requests,
            "errors": self.errors,
            "window": len(rows),
            "error_rate": error_rate(rows),
            "p50_ms": p_ms(rows, 0.5),
            "p99_ms": p_ms(rows, 0.99),
        }


@dataclass(frozen=True)
class AutoPromote:
    """The bounds of --auto-promote. It decides after ``requests`` canary requests, within
    these bounds of the stable version."""

    requests: int
    max_error_delta: float
    max_p99_ratio: float


def sticky_share(model: str, client_id: str) -> float:
    """Return a client's fixed point in [0, 1). Below the canary share, it is a canary client."""
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
        self.trial = {v: Window(_TRIAL_KEPT) for v in versions}  # auto-promote: the routed requests only
        self.trial_from: float | None = None  # when the canary's first routed request was answered
        self.decisions: list[dict[str, Any]] = []  # promotions and rollbacks, oldest first
        self._coin = random.Random(seed)

    def pick(self, client_id: str | None = None) -> str:
        if self.canary is None:
            return self.stable
        point = sticky_share(self.model, client_id) if client_id else self._coin.random()
        return self.canary if point < self.share else self.stable

    def record(
        self, version: str, seconds: float, ok: bool, routed: bool = True, t: float | None = None
    ) -> dict[str, Any] | None:
        """Count an answered request. ``routed`` says the router picked its version, since the
        request named none. With auto-promote, return the decision it triggered, if any."""
        t = time.monotonic() if t is None else t
        self.stats[version].add(seconds, ok, t)
        if self.auto is None or not routed or version not in (self.canary, self.stable):
            return None
        if version == self.canary and self.trial_from is None:
            self.trial_from = t
        self.trial[version].add(t, seconds, ok)
        return self._decide() if self.trial_from is not None else None

    def _decide(self) -> dict[str, Any] | None:
        """Promote or roll back once both versions have enough routed requests since the
        canary's first one. Return None before."""
        assert self.auto is not None and self.canary is not None and self.trial_from is not None
        new, old = self.trial[self.canary].since(self.trial_from), self.trial[self.stable].since(self.trial_from)
        answered = sum(ok for _, _, ok in old)
        if len(new) < self.auto.requests or answered < min(MIN_STABLE, self.auto.requests):
            return None
        err_new, err_old = error_rate(new), error_rate(old)
        err_ok = err_new <= err_old + self.auto.max_error_delta
        p99_new, p99_old = p_ms(new, 0.99), p_ms(old, 0.99)
        p99_ok = p99_new is not None and p99_old is not None and p99_new <= p99_old * self.auto.max_p99_ratio
        fmt = lambda ms: "n/a" if ms is None else f"{ms:.2f} ms"  # noqa: E731
        why = (
            f"after {len(new)} canary requests and {len(old)} stable ones over the same span: error rate "
            f"{err_new:.2%} vs {err_old:.2%} (bound +{self.auto.max_error_delta:.2%}), p99 {fmt(p99_new)} vs "
            f"{fmt(p99_old)} (bound x{self.auto.max_p99_ratio:g})"
        )
        return self.promote(why) if err_ok and p99_ok else self.rollback(why)

    def promote(self, why: str = "asked") -> dict[str, Any]:
        """Make the canary the stable version. The old stable one stays loaded, reachable by version."""
        if self.canary is None:
            raise LookupError(f"model {self.model} has no canary to promote")
        decision = {"action": "promote", "from": self.stable, "to": self.canary, "why": why, "at": time.time()}
        self.stable, self.canary, self.auto = self.canary, None, None
        self.decisions.append(decision)
        return decision

    def rollback(self, why: str = "asked") -> dict[str, Any]:
        """Stop routing to the canary. It stays loaded, reachable by version."""
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
