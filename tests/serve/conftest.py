"""One small trained digits run with two exports (fp32 and int8), and a real `fwk serve` on a free port."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import run_fwk

# 30 steps reach ~93% validation accuracy in ~10 s: a real model, enough to serve
DIGITS = ["train.max_steps=30", "train.eval_every=0", "train.log_every=50", "jit=off"]
# export settings sized for tests: one calibration batch, timing cut to a single run
QUICK = ["export.calib_batches=1", "export.val_batches=2", "export.latency_batch=2", "export.warmup=0"]
QUICK += ["export.iterations=1"]


@dataclass(frozen=True)
class Exports:
    runs: Path  # the runs root
    run: str  # the run id
    fp32: str  # export id of --quantize none (fp32.onnx)
    int8: str  # export id of --quantize int8 (int8.onnx)
    output: Path  # fwk export --output: the fp32 model file

    def model(self, export: str) -> Path:
        report = json.loads((self.runs / self.run / "exports" / export / "export_report.json").read_text())
        return self.runs / self.run / "exports" / export / report["final"]


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Exports:
    """`fwk train`, `fwk export --quantize none --output m.onnx`, then an int8 export of the same run.

    The int8 export runs in this process (its torch imports are paid once), the rest
    through the real command, as a new user types it."""
    from fwk.export.pipeline import run_export
    from fwk.export.settings import PrunePlan, load_settings
    from fwk.track.store import RunDir

    base = tmp_path_factory.mktemp("serve")
    runs = base / "runs"
    out = run_fwk("train", *DIGITS, runs=runs)
    assert out.returncode == 0, out.stderr
    (run,) = [p for p in runs.iterdir() if (p / "config.yaml").is_file()]
    output = base / "m.onnx"
    out = run_fwk("export", run.name, "--quantize", "none", *QUICK, "--output", str(output), runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    quiet = lambda _: None  # noqa: E731
    cfg = load_settings(QUICK)
    int8 = run_export(RunDir(run), PrunePlan(), "int8", cfg, 100.0, None, False, show=quiet)
    (fp32,) = [p.name for p in (run / "exports").iterdir() if p.is_dir() and p.name != int8["export_id"]]
    return Exports(runs, run.name, fp32, int8["export_id"], output)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text()


def admin(server: Server) -> dict[str, str]:
    """The Authorization header of the admin token the server printed at start."""
    found = re.search(r"admin token \(.*\): (\S+)$", server.output(), re.MULTILINE)
    assert found, server.output()
    return {"Authorization": f"Bearer {found.group(1)}"}


def get(server: Server, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    """GET (or POST with ``body``) a path; (status, body) also for 4xx and 5xx."""
    req = urllib.request.Request(f"http://{server.url}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start_server(exports: Exports, *args: str, log: Path, timeout: float = 60) -> Server:
    """`fwk serve ARGS` on a free loopback port, returned once /v2/health/ready is true."""
    port = free_port()
    env = {**os.environ, "FWK_RUNS": str(exports.runs), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "fwk", "serve", *args, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = Server(proc, port, log)
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"fwk serve exited {proc.returncode}:\n{server.output()}"
        assert time.monotonic() < deadline, f"not ready after {timeout} s:\n{server.output()}"
        try:
            if get(server, "/v2/health/ready")[0] == 200:
                return server
        except OSError:  # not listening yet
            pass
        time.sleep(0.1)


def stop(server: Server) -> int:
    """SIGTERM, then SIGKILL if it has not exited within 30 s; its exit code."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    return server.proc.returncode


@pytest.fixture
def serving(exports: Exports, tmp_path: Path) -> Iterator:
    """A function that starts `fwk serve ARGS`; every server it started is stopped at the end."""
    started: list[Server] = []

    def start(*args: str) -> Server:
        server = start_server(exports, *args, log=tmp_path / f"serve-{len(started)}.log")
        started.append(server)
        return server

    yield start
    for server in started:
        stop(server)
