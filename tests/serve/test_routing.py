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


def test_auto_promote_promotes_a_good_canary_after_n_requests() -> None:
    r = _router(auto=AutoPromote(requests=50, max_error_delta=0.01, max_p99_ratio=1.5))
    for _ in range(200):
        r.record("old", 0.010, ok=True)
    for i in range(49):
        assert r.record("new", 0.011, ok=True) is None, i
    d = r.record("new", 0.011, ok=True)
    assert d is not None and d["action"] == "promote" and r.stable == "new"
    assert "after 50 canary requests" in d["why"]


@pytest.mark.parametrize("fail_every,latency,reason", [(5, 0.010, "errors"), (0, 0.030, "p99")])
def test_auto_promote_rolls_back_a_bad_canary(fail_every: int, latency: float, reason: str) -> None:
    r = _router(auto=AutoPromote(requests=50, max_error_delta=0.01, max_p99_ratio=1.5))
    for _ in range(200):
        r.record("old", 0.010, ok=True)
    d = None
    for i in range(50):
        d = r.record("new", latency, ok=not (fail_every and i % fail_every == 0))
    assert d is not None and d["action"] == "rollback", reason
    assert r.stable == "old" and r.canary is None
    stats = r.state()["versions"]["new"]
    assert stats["requests"] == 50 and stats["errors"] == (10 if fail_every else 0)
