"""Tracking sinks: TensorBoard event files read back with TensorBoard's own reader, and a
real MLflow server (SQLite store, local artifacts) on loopback."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fwk.components.sinks import MLflow, TensorBoard, Tracking, params, scalars
from fwk.config.schema import TrackingConfig
from fwk.track.store import RunDir
from tests.conftest import require, run_fwk

TINY = ["train.max_steps=20", "train.log_every=5", "train.eval_every=10"]


def events(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``log_dir`` as (step, value), read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def expected(run: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as the scalars a sink gets: finite numbers, as float32 (TensorBoard's format)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        step, kind = row.pop("step"), row.pop("kind")
        for tag, value in scalars(row, kind).items():
            out.setdefault(tag, []).append((step, value))
    return out


def as_float32(series: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(s, float(np.float32(v))) for s, v in points] for tag, points in series.items()}


def test_scalars_keep_finite_numbers_only() -> None:
    row = {"loss": 0.5, "samples": 64, "nan_loss": float("nan"), "big": math.inf, "skipped": True, "mode": "fp32"}
    assert scalars(row, "train") == {"train/loss": 0.5, "train/samples": 64.0}


def test_params_flatten_the_config_within_mlflows_limit() -> None:
    config = {"optim": {"name": "adamw", "lr": 0.003, "betas": [0.9, 0.95]}, "tags": [], "memo": "x" * 7000}
    got = params(config)
    assert got["optim.name"] == "adamw" and got["optim.lr"] == "0.003" and got["optim.betas"] == "[0.9, 0.95]"
    assert got["tags"] == "[]" and len(got["memo"]) == 6000


def test_tracking_mlflow_without_uri_is_one_line(runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = run_fwk("train", "--cfg", "tracking=mlflow", runs=runs)
    assert out.returncode == 2
    assert out.stderr.startswith("fwk: error: tracking.uri='' is not allowed: expected an MLflow tracking URI")
    assert len(out.stderr.strip().splitlines()) == 1
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")  # MLflow's own variable sets the default
    out = run_fwk("train", "--cfg", "tracking=mlflow", runs=runs)
    assert out.returncode == 0, out.stderr
    assert "  uri: http://127.0.0.1:5000\n" in out.stdout and "  mlflow: true\n" in out.stdout


def test_resumed_writer_drops_the_events_after_the_checkpoint(tmp_path: Path) -> None:
    # first launch: logs steps 5..20, crashes; its last checkpoint was at step 10
    first = TensorBoard(tmp_path, step=0)
    first.log(5, {"train/loss": 4.0})
    for step in (10, 15, 20):
        first.log(step, {"train/loss": 9.0 - step / 10, "eval/val_acc": 0.5})
    first.close()
    time.sleep(1.1)  # event file names carry the second they were opened in
    resumed = TensorBoard(tmp_path, step=10)
    for step in (15, 20):
        resumed.log(step, {"train/loss": 1.0 / step})
    resumed.close()
    got = events(tmp_path)
    assert got["train/loss"] == as_float32({"x": [(5, 4.0), (10, 8.0), (15, 1 / 15), (20, 1 / 20)]})["x"]
    assert got["eval/val_acc"] == [(10, 0.5)]  # 15 and 20 were not logged again: gone


@pytest.mark.slow
def test_train_writes_tensorboard_events_equal_to_metrics(runs: Path) -> None:
    out = run_fwk("train", *TINY, runs=runs)
    assert out.returncode == 0, out.stderr
    (run,) = runs.glob("*/")
    want = as_float32(expected(run))
    assert [s for s, _ in want["train/loss"]] == [5, 10, 15, 20]
    assert [s for s, _ in want["eval/val_acc"]] == [10, 20]
    assert {"train/lr", "train/samples_per_s", "eval/val_loss"} <= set(want)
    assert events(run / "tensorboard") == want  # every scalar, step and float32 value
    assert not (run / "mlflow.json").exists()


# --- MLflow: a real server on loopback -----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` on 127.0.0.1 with a SQLite store and local artifacts; its URL."""
    require(importlib.util.find_spec("mlflow") is not None, "mlflow is not installed: pip install 'fwk[mlflow]'")
    root = tmp_path_factory.mktemp("mlflow")
    url = f"http://127.0.0.1:{_free_port()}"
    argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1]]
    argv += ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "art")]
    log = open(root / "server.log", "w")
    # its own session: the server starts uvicorn workers, killed with it as one group
    server = subprocess.Popen([*argv, "--workers", "1"], cwd=root, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not _healthy(url):
            assert server.poll() is None, (root / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "mlflow server not healthy after 90 s"
            time.sleep(0.25)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _client(url: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(url)


def _history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_train_logs_to_mlflow(runs: Path, mlflow_server: str) -> None:
    out = run_fwk("train", *TINY, "tracking=mlflow", f"tracking.uri={mlflow_server}", "tags=[smoke]", runs=runs)
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr, out.stderr
    (run,) = runs.glob("*/")
    client = _client(mlflow_server)
    kept = json.loads((run / "mlflow.json").read_text())
    found = client.get_run(kept["run_id"])
    assert found.info.run_name == run.name and found.info.status == "FINISHED"
    assert client.get_experiment(found.info.experiment_id).name == "digits_cnn"
    tags = found.data.tags
    assert tags["fwk.run_id"] == run.name and tags["fwk.recipe"] == "digits_cnn" and tags["smoke"] == "true"
    assert found.data.params["optim.lr"] == "0.003" and found.data.params["train.max_steps"] == "20"
    assert not any(key.startswith(("tracking.", "paths.")) for key in found.data.params)
    # MLflow stores float64: the values equal metrics.jsonl's exactly
    want = expected(run)
    for key in ("train/loss", "train/lr", "eval/val_acc"):
        assert _history(client, kept["run_id"], key) == want[key], key
    artifacts = {a.path for a in client.list_artifacts(kept["run_id"])}
    assert {"config.yaml", "summary.json", "meta.json", "metrics.png"} <= artifacts
    assert events(run / "tensorboard") == as_float32(want)  # TensorBoard as well


def test_resumed_fwk_run_continues_its_mlflow_run(tmp_path: Path, mlflow_server: str) -> None:
    run = RunDir(tmp_path / "abc123")
    run.path.mkdir()
    run.config.write_text("recipe: digits_cnn\noptim:\n  lr: 0.1\ntags: []\n")
    cfg = TrackingConfig(name="mlflow", mlflow=True, uri=mlflow_server, experiment="resume-test")
    first = MLflow(cfg, run)
    for step in (5, 10, 15):
        first.log(step, {"train/loss": 1.0 / step})
    first.close()  # stopped: the checkpoint was at step 10
    assert _client(mlflow_server).get_run(first.id).info.status == "KILLED"
    again = MLflow(cfg, run)
    assert again.id == first.id and _client(mlflow_server).get_run(first.id).info.status == "RUNNING"
    for step in (15, 20):  # step 15 is logged again after the resume: MLflow keeps one point
        again.log(step, {"train/loss": 1.0 / step})
    assert _history(_client(mlflow_server), first.id, "train/loss") == [(s, 1.0 / s) for s in (5, 10, 15, 20)]


def test_mlflow_failing_mid_run_warns_once_and_training_goes_on(
    tmp_path: Path, mlflow_server: str, said: pytest.LogCaptureFixture
) -> None:
    run = RunDir(tmp_path / "def456")
    run.path.mkdir()
    run.config.write_text("recipe: digits_cnn\ntags: []\n")
    tracking = Tracking(TrackingConfig(name="mlflow", mlflow=True, uri=mlflow_server), run, is_main=True)
    tracking.start(step=0)
    dead = f"http://127.0.0.1:{_free_port()}"
    tracking.mlflow.client = _client(dead)  # the server goes away mid-run
    tracking.log(5, {"loss": 1.0}, "train")
    tracking.log(10, {"loss": 0.5}, "train")
    tracking.close()
    lines = [r.getMessage() for r in said.records if r.name.startswith("fwk")]
    assert len(lines) == 1 and lines[0].startswith("fwk: warning: MLflow at") and "goes on" in lines[0], lines
    assert events(run.path / "tensorboard")["train/loss"] == [(5, 1.0), (10, 0.5)]


@pytest.mark.slow
def test_unreachable_mlflow_server_fails_before_any_run_dir(runs: Path) -> None:
    require(importlib.util.find_spec("mlflow") is not None, "mlflow is not installed: pip install 'fwk[mlflow]'")
    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    out = run_fwk("train", *TINY, "tracking=mlflow", f"tracking.uri={uri}", runs=runs, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"fwk: error: cannot reach the MLflow server at {uri} (Connection refused)")
    assert "tracking=tensorboard" in lines[0]
    assert not list(runs.glob("*/"))  # no run dir: nothing half made
