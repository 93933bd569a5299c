"""The overload benchmark's short version (benchmarks/serve_overload.py): an open-loop
load past what a tightly bounded server takes. Not a timed test: what is checked is that
the server stays up and every request gets an answer, a result or a bound's refusal."""

from __future__ import annotations

import asyncio
from pathlib import Path

from benchmarks.serve_overload import open_loop, request
from tests.serve.conftest import Exports, start_server, stop

BOUNDS = ["serve.max_inflight=4", "serve.max_queue_rows=4", "serve.max_request_rows=1", "serve.max_batch_size=1"]
BOUNDS += ["serve.request_timeout_s=0.5", "serve.warmup=0"]


def test_open_loop_overload_gets_an_answer_for_every_request(exports: Exports, tmp_path: Path) -> None:
    server = start_server(exports, exports.fp32, *BOUNDS, log=tmp_path / "serve.log")
    try:
        data = request(server.port, "digits_cnn", "FP32", (1, 1, 8, 8))
        got = asyncio.run(open_loop(server.port, server.proc.pid, data, rate=1500, seconds=3))
        assert server.proc.poll() is None, server.output()
    finally:
        stop(server)
    codes = got["codes"]
    assert set(codes) - {"not sent"} <= {200, 503, 504}, codes  # no 500, no hang, no dropped connection
    assert sum(codes.get(c, 0) for c in (200, 503, 504)) == got["sent"] and codes.get(200, 0) > 0, got
    assert got["health_failed"] == 0 and got["peak_rss_mb"] < 1024, got
