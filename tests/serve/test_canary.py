"""Canary rollout through the real server: sticky client ids, promote and rollback under load."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import numpy as np

from tests.serve.conftest import Exports, Server, admin, get

X = np.random.default_rng(0).standard_normal((1, 1, 8, 8)).astype(np.float32)
TENSOR = {"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": X.ravel().tolist()}
BODY = json.dumps({"inputs": [TENSOR]})


def _version(server: Server, client: str | None = None) -> tuple[int, str]:
    status, body = get(server, "/v2/models/digits_cnn/infer", BODY.encode(), {"X-Client-Id": client} if client else {})
    return status, json.loads(body).get("model_version", "") if status == 200 else body.decode()


def _under_load(server: Server, switch: str, threads: int = 4, limit: int = 300) -> tuple[Counter, list, dict]:
    """Requests from ``threads`` callers (at most ``limit`` each) while POST .../``switch`` runs
    midway; returns every status, the (status, version) of the requests sent after the switch
    had answered, and its answer."""
    results: list[tuple[float, int, str]] = []  # (when sent, status, version)
    started, stop = threading.Barrier(threads + 1), threading.Event()

    def caller() -> None:
        started.wait()
        for _ in range(limit):
            if stop.is_set():
                return
            sent = time.monotonic()
            results.append((sent, *_version(server)))

    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for w in workers:
        w.start()
    started.wait()
    while len(results) < 40:  # traffic is flowing before the switch
        threading.Event().wait(0.01)
    status, body = get(server, f"/v2/models/digits_cnn/{switch}", b"", admin(server))
    switched, after = time.monotonic(), len(results)
    while len(results) < after + 40:
        threading.Event().wait(0.01)
    stop.set()
    for w in workers:
        w.join(30)
    assert status == 200, body
    # a request sent before the switch answered may have been routed before it, and finish after
    later = [(code, version) for sent, code, version in results if sent > switched]
    return Counter(code for _, code, _ in results), later, json.loads(body)


def test_sticky_client_ids_and_rollback_without_failed_requests(serving, exports: Exports) -> None:
    server = serving(exports.fp32, "--canary", exports.int8, "--canary-share", "0.3")
    seen = {}
    for i in range(40):
        versions = {_version(server, f"client-{i}") for _ in range(3)}
        assert len(versions) == 1, versions  # every request of a client on one version
        seen[f"client-{i}"] = versions.pop()
    assert {s for s, _ in seen.values()} == {200}
    assert {v for _, v in seen.values()} == {exports.fp32, exports.int8}  # 30% of 40 clients: both sides
    codes, after, decision = _under_load(server, "rollback")
    assert codes == Counter({200: sum(codes.values())})  # no failed request during the switch
    assert decision["action"] == "rollback" and decision["stable"] == exports.fp32
    assert {v for _, v in after} == {exports.fp32}  # after the switch: only the stable version
    stats = json.loads(get(server, "/v2/models/digits_cnn/stats")[1])
    assert stats["canary"] is None and stats["versions"][exports.int8]["requests"] > 0
    assert _version(server, "anyone")[1] == exports.fp32
    assert f"rollback of digits_cnn: {exports.int8} -> {exports.fp32}" in server.output()


def test_promote_without_failed_requests(serving, exports: Exports) -> None:
    server = serving(exports.fp32, "--canary", exports.int8)  # the default share, 5%
    codes, after, decision = _under_load(server, "promote")
    assert codes == Counter({200: sum(codes.values())})
    assert decision["action"] == "promote" and decision["stable"] == exports.int8
    assert {v for _, v in after} == {exports.int8}
    status, body = get(server, "/v2/models/digits_cnn/rollback", b"", admin(server))
    assert status == 409 and "has no canary to rollback" in json.loads(body)["error"]


def test_the_admin_token_is_the_users_or_none(serving, exports: Exports) -> None:
    """serve.admin_token=SECRET: that one, and nothing printed; empty: promote and rollback are off."""
    server = serving(exports.fp32, "--canary", exports.int8, "serve.admin_token=s3cret")
    assert "admin token" not in server.output()
    assert get(server, "/v2/models/digits_cnn/promote", b"", {"Authorization": "Bearer auto"})[0] == 401
    status, body = get(server, "/v2/models/digits_cnn/promote", b"", {"Authorization": "Bearer s3cret"})
    assert status == 200 and json.loads(body)["stable"] == exports.int8
    off = serving(exports.fp32, "--canary", exports.int8, "serve.admin_token=")
    status, body = get(off, "/v2/models/digits_cnn/rollback", b"", {"Authorization": "Bearer "})
    assert status == 403 and "promote and rollback are off (serve.admin_token is empty)" in json.loads(body)["error"]
