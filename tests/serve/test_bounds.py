"""`fwk serve` under more than it takes: requests in flight, the deadline, a body that never
arrives. Each bound answers at once (503 with Retry-After, 504, 408), is counted, and the
health check keeps answering meanwhile."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tests.serve.conftest import Exports, Server, get, start_server, stop

BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]})
# a lone request waits 5 s for company (adaptive off): the two in flight outlast the 1 s deadline
SETTINGS = ["serve.adaptive=false", "serve.max_delay_ms=5000", "serve.max_batch_size=8", "serve.warmup=0"]
SETTINGS += ["serve.max_inflight=2", "serve.request_timeout_s=1", "serve.body_timeout_s=0.5"]


@pytest.fixture(scope="module")
def server(exports: Exports, tmp_path_factory: pytest.TempPathFactory):
    s = start_server(exports, exports.fp32, *SETTINGS, log=tmp_path_factory.mktemp("bounds") / "serve.log")
    yield s
    stop(s)


def _refused(server: Server, reason: str) -> float:
    text = get(server, "/metrics")[1].decode()
    line = next((x for x in text.splitlines() if x.startswith(f'fwk_serve_refused_total{{reason="{reason}"}}')), None)
    return float(line.split()[-1]) if line else 0.0


def _post(server: Server) -> tuple[int, dict, float]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://{server.url}/v2/models/digits_cnn/infer", data=BODY.encode())
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, time.perf_counter() - t0
    except urllib.error.HTTPError as e:
        headers = {k.lower(): v for k, v in e.headers.items()}
        return e.code, headers | {"error": json.loads(e.read())["error"]}, time.perf_counter() - t0


def test_over_max_inflight_is_503_at_once_and_past_the_deadline_504(server: Server) -> None:
    before = {r: _refused(server, r) for r in ("inflight", "deadline")}
    held: list[tuple[int, dict, float]] = []
    callers = [threading.Thread(target=lambda: held.append(_post(server))) for _ in range(2)]
    for c in callers:
        c.start()
    time.sleep(0.3)  # both in flight, waiting for company
    status, headers, took = _post(server)
    assert status == 503 and headers["retry-after"] == "1" and took < 0.5, (status, headers, took)
    assert "2 requests in flight (serve.max_inflight=2)" in headers["error"]
    t0 = time.perf_counter()
    assert get(server, "/v2/health/ready")[0] == 200 and time.perf_counter() - t0 < 0.1  # meanwhile
    for c in callers:
        c.join(30)
    assert sorted(s for s, _, _ in held) == [504, 504]
    assert all("no answer within serve.request_timeout_s=1 s" in h["error"] and t < 3 for _, h, t in held)
    assert _refused(server, "inflight") == before["inflight"] + 1
    assert _refused(server, "deadline") == before["deadline"] + 2


def test_a_body_that_stops_arriving_is_408(server: Server) -> None:
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        head = f"POST /v2/models/digits_cnn/infer HTTP/1.1\r\nHost: {server.url}\r\nContent-Length: 1000\r\n\r\n"
        s.sendall(head.encode() + BODY[:10].encode())  # 10 of the 1000 bytes, then nothing
        t0 = time.perf_counter()
        reply = ""
        while not reply.endswith("}") and (chunk := s.recv(4096).decode()):  # headers and body may come apart
            reply += chunk
    assert reply.startswith("HTTP/1.1 408"), reply
    assert "10 bytes of the body arrived in serve.body_timeout_s=0.5 s" in reply and time.perf_counter() - t0 < 3
    high = json.loads(BODY) | {"parameters": {"priority": "high"}}  # runs at once, without company
    assert get(server, "/v2/models/digits_cnn/infer", json.dumps(high).encode())[0] == 200  # and it goes on serving
