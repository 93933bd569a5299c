"""Version routing, in process: canary share within binomial bounds, stickiness, promote, rollback.

The share statistics drive the router directly (thousands of picks in milliseconds);
test_canary.py checks stickiness, promote and rollback through the real server."""

from __future__ import annotations

import math

import pytest

from fwk.serve.routing import AutoPromote, Router

N, SHARE = 4000, 0.05
# 4.5 standard deviations of Binomial(N, SHARE): a correct router fails once in ~150,000 runs
BOUND = 4.5 * math.sqrt(N * SHARE * (1 - SHARE))


def _router(**kw) -> Router:
    return Router("m", ["old", "new"], "old", canary="new", share=SHARE, **kw)


def test_canary_share_without_client_ids_is_binomial() -> None:
    r = _router(seed=1)
    hits = sum(r.pick() == "new" for _ in range(N))
    assert abs(hits - N * SHARE) <= BOUND, hits


def test_canary_share_over_client_ids_is_binomial_and_sticky() -> None:
    r = _router()
    picks = {f"user-{i}": r.pick(f"user-{i}") for i in range(N)}
    hits = sum(v == "new" for v in picks.values())
    assert abs(hits - N * SHARE) <= BOUND, hits
    assert all(r.pick(c) == v for c, v in list(picks.items())[:500])  # the same client, the same side


def test_promote_and_rollback() -> None:
    r = _router()
    d = r.promote()
    assert (d["action"], d["from"], d["to"]) == ("promote", "old", "new")
    assert r.stable == "new" and r.canary is None
    assert {r.pick(f"u{i}") for i in range(200)} == {"new"}
    with pytest.raises(LookupError, match="no canary to promote"):
        r.promote()
    r = _router()
    r.rollback()
    assert r.stable == "old" and r.canary is None and {r.pick() for _ in range(200)} == {"old"}
    assert [d["action"] for d in r.decisions] == ["rollback"]


def _traffic(r: Router, n: int, latency: float = 0.011, fail_every: int = 0, stable_each: int = 4):
    """``n`` routed canary requests, each after ``stable_each`` routed stable ones (10 ms, all
    answered), over one span of time; the last decision made, if any."""
    decision, t = None, max((row[0] for w in r.trial.values() for row in w.rows), default=0.0)
    for i in range(n):
        for _ in range(stable_each):
            t += 0.001
            decision = r.record("old", 0.010, ok=True, t=t) or decision
        t += 0.001
        decision = r.record("new", latency, ok=not (fail_every and i % fail_every == 0), t=t) or decision
    return decision


def test_auto_promote_promotes_a_good_canary_after_n_requests() -> None:
    r = _router(auto=AutoPromote(requests=50, max_error_delta=0.01, max_p99_ratio=1.5))
    assert _traffic(r, 49) is None
    d = _traffic(r, 1)
    assert d is not None and d["action"] == "promote" and r.stable == "new"
    # the span begins at the canary's first routed request: the 4 stable ones before it are not in it
    assert "after 50 canary requests and 196 stable ones over the same span" in d["why"]


@pytest.mark.parametrize("fail_every,latency,reason", [(5, 0.010, "errors"), (0, 0.030, "p99")])
def test_auto_promote_rolls_back_a_bad_canary(fail_every: int, latency: float, reason: str) -> None:
    r = _router(auto=AutoPromote(requests=50, max_error_delta=0.01, max_p99_ratio=1.5))
    d = _traffic(r, 50, latency, fail_every)
    assert d is not None and d["action"] == "rollback", reason
    assert r.stable == "old" and r.canary is None
    stats = r.state()["versions"]["new"]
    assert stats["requests"] == 50 and stats["errors"] == (10 if fail_every else 0)


def test_auto_promote_counts_only_routed_traffic() -> None:
    """Requests that name the canary's version chose it: they cannot promote it."""
    r = _router(auto=AutoPromote(requests=50, max_error_delta=0.01, max_p99_ratio=1.5))
    for i in range(200):
        assert r.record("new", 0.001, ok=True, routed=False, t=i / 1000) is None
        assert r.record("old", 0.010, ok=True, t=i / 1000) is None
    assert r.canary == "new" and r.state()["versions"]["new"]["requests"] == 200  # served, counted in stats
    assert _traffic(r, 50, latency=0.030)["action"] == "rollback"  # the routed ones decide


def test_auto_promote_waits_for_the_stable_versions_latencies_over_the_same_span() -> None:
    """Stable latencies from before the canary's first request do not count; with none of
    its own over the canary's span, the stable version cannot be compared: no decision."""
    r = _router(auto=AutoPromote(requests=50, max_error_delta=0.01, max_p99_ratio=1.5))
    for i in range(500):
        r.record("old", 0.010, ok=True, t=i / 1000)
    assert _traffic(r, 60, stable_each=0) is None and r.canary == "new"
    d = _traffic(r, 1, stable_each=100)  # decided once the stable version has min(100, N=50) in the span
    assert d is not None and "after 60 canary requests and 50 stable ones" in d["why"]


def test_error_rate_and_latencies_are_the_windows() -> None:
    r = Router("m", ["v"], "v", window=10)
    for i in range(10):
        r.record("v", 1.0, ok=False, t=i)
    for i in range(10):
        r.record("v", 0.002, ok=True, t=10 + i)
    s = r.state()["versions"]["v"]
    assert (s["requests"], s["errors"], s["window"], s["error_rate"]) == (20, 10, 10, 0.0)
    assert s["p99_ms"] == pytest.approx(2.0)
