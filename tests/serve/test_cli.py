"""`fwk serve` as a user types it: the train -> export --output -> serve flow, SIGTERM drain, one-line errors."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import run_fwk
from tests.serve.conftest import Exports, get, start_server

BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]})


def test_newest_export_by_default_and_sigterm_drains_in_flight_requests(exports: Exports, tmp_path: Path) -> None:
    # no id: the newest export (the int8 one, made last); requests wait 1 s for company, then SIGTERM
    server = start_server(exports, "serve.adaptive=false", "serve.max_delay_ms=1000", log=tmp_path / "serve.log")
    try:
        assert f"model digits_cnn: {exports.int8} (stable, int8.onnx of run {exports.run})" in server.output()
        replies: list[tuple[int, bytes]] = []
        callers = [
            threading.Thread(target=lambda: replies.append(get(server, "/v2/models/digits_cnn/infer", BODY.encode())))
            for _ in range(4)
        ]
        for c in callers:
            c.start()
        time.sleep(0.4)  # the 4 requests are in flight, waiting in the batch
        server.proc.send_signal(signal.SIGTERM)
        for c in callers:
            c.join(30)
        assert server.proc.wait(30) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert [s for s, _ in replies] == [200] * 4
    assert all(json.loads(b)["model_version"] == exports.int8 for _, b in replies)
    assert "stopped on SIGTERM: in-flight requests drained" in server.output()


def test_run_id_prefix_serves_its_newest_export(exports: Exports, serving) -> None:
    server = serving(exports.run[:6], "--name", "digits", "serve.max_batch_size=4")
    status, body = get(server, "/v2/models/digits/infer", BODY.encode())
    assert status == 200 and json.loads(body)["model_version"] == exports.int8
    assert json.loads(get(server, "/v2/models/digits")[1])["versions"] == [exports.int8]


@pytest.mark.parametrize(
    "args,expected",
    [
        (["0000000"], "no export or run '0000000' under {runs}; closest ids: "),
        (["serve.max_batch_size=0"], "serve.max_batch_size=0 is not allowed: expected an integer >= 1"),
        (["serve.max_connections=8"], "serve.max_connections=8 is not allowed: expected an integer >= serve.max_inf"),
        (["serve.nope=1"], "unknown key 'serve.nope'; valid keys here: name, max_batch_size"),
        (["--canary-share", "0.1"], "--canary-share needs --canary EXPORT_ID"),
        (["--auto-promote"], "--auto-promote needs --canary EXPORT_ID"),
        (["--bogus"], "unknown option '--bogus' for fwk serve"),
        (["--port", "70000"], "--port=70000 is not allowed: expected a TCP port in 1..65535"),
        (["{fp32}", "--canary", "{fp32}"], "canary {fp32} is also the stable version of digits_cnn"),
        (["{fp32}", "--canary", "{int8}", "--canary-share", "1.5"], "--canary-share=1.5 is not allowed"),
    ],
)
def test_mistakes_are_one_line(exports: Exports, args: list[str], expected: str) -> None:
    ids = {"fp32": exports.fp32, "int8": exports.int8, "runs": exports.runs}
    out = run_fwk("serve", *[a.format(**ids) for a in args], runs=exports.runs, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"fwk: error: {expected.format(**ids)}"), line


def test_no_exports_is_one_line(tmp_path: Path) -> None:
    out = run_fwk("serve", runs=tmp_path / "runs", timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"fwk: error: no exports under {tmp_path / 'runs'}; make one with `fwk export RUN_ID` "
        "(or set FWK_RUNS / paths.runs=DIR)"
    )
