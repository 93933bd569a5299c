"""The sinks where rank 0 sends its metrics besides metrics.jsonl. Only this module reads
conf/tracking/.

TensorBoard event files go to ``<run dir>/tensorboard/`` (``tensorboard --logdir runs``). With
``tracking=mlflow`` an MLflow tracking server gets one run per fwk run: the config as params,
every metric with its step, and at the end config.yaml, summary.json, meta.json and a plot as
artifacts. The Reporter forwards every row it logs, and its finite numbers become the scalars
``train/<key>`` and ``eval/<key>``.

A run's result is never lost to a tracking server. A server that cannot be reached stops the
launch with one line before any run dir exists (``check``). An error mid-run is one warning
line, and training goes on without MLflow. TensorBoard writes local files, like metrics.jsonl,
so its errors are the run's and raise.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from fwk.config.schema import TrackingConfig
from fwk.errors import UserError
from fwk.track.run_id import identity
from fwk.track.status import flatten
from fwk.track.store import RunDir, write_atomic

logger = logging.getLogger(__name__)

# mlflow retries a failed request 7 times with exponential backoff (minutes on a dead
# server) and waits 120 s for an answer: training would stall that long at a log step.
# The user's own settings of these variables win.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
_PARAM_CHARS = 6000  # MLflow's limit on a param value (mlflow >= 2.10's servers)
_BATCH = 100  # MLflow's limit on params per log_batch request


def scalars(row: dict[str, Any], kind: str) -> dict[str, float]:
    """Turn a logged row's finite numbers into ``<kind>/<key>`` scalars. Text, flags and NaN
    are left out."""
    return {
        f"{kind}/{key}": float(value)
        for key, value in row.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def params(config: dict[str, Any]) -> dict[str, str]:
    """Turn a config into MLflow params, ``{"optim.lr": "0.003", ...}``, with values cut to
    MLflow's limit."""
    return {
        key: (value if isinstance(value, str) else json.dumps(value))[:_PARAM_CHARS]
        for key, value in flatten(config).items()
    }


class TensorBoard:
    """A sink that writes TensorBoard event files in ``log_dir`` (fwk/components/events.py)."""

    def __init__(self, log_dir: Path, step: int) -> None:
        from fwk.components.events import EventWriter

        # TensorBoard's reader drops the events at steps >= purge_step that earlier writers
        # left. A run resumed from its checkpoint at ``step`` logs the steps after it again,
        # as metrics.jsonl is truncated likewise, and keeps the rows at ``step`` itself. A
        # run that starts over from 0 replaces them all.
        self.writer = EventWriter(log_dir, purge_step=step + 1 if step else 0)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.writer.add_scalars(step, values)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MLflow:
    """One MLflow run per fwk run, named by the run id. ``<run dir>/mlflow.json`` keeps its
    id, so that a resumed fwk run continues the same MLflow run on the same server."""

    def __init__(self, cfg: TrackingConfig, run: RunDir) -> None:
        self.client, self.uri, self.run = _client(cfg.uri), cfg.uri, run
        self.state = run.path / "mlflow.json"
        continued = self._continued()
        self.id = continued or self._create(cfg.experiment, yaml.safe_load(run.config.read_text()))
        # an earlier launch logged up to this step: a resumed run logs again the steps after
        # its checkpoint, and MLflow cannot delete the points it already has
        self.logged = self._last_step() if continued else -1

    def _continued(self) -> str | None:
        """Find the MLflow run of an earlier launch of this fwk run on this server, and set it
        running again."""
        try:
            kept = json.loads(self.state.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if kept.get("uri") != self.uri:
            return None
        from mlflow.exceptions import MlflowException

        try:
            found = self.client.get_run(kept["run_id"])
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":  # the server's store was reset
                return None
            raise
        if found.info.lifecycle_stage != "active":  # deleted in the UI: start afresh
            return None
        self.client.update_run(found.info.run_id, status="RUNNING")
        return found.info.run_id

    def _create(self, experiment: str, config: dict[str, Any]) -> str:
        from mlflow.entities import Param

        experiment_id = self._experiment(experiment or config.get("recipe") or "fwk")
        tags = {"fwk.run_id": self.run.id, "fwk.recipe": str(config.get("recipe", ""))}
        tags.update({str(tag): "true" for tag in config.get("tags") or []})
        run_id = self.client.create_run(experiment_id, run_name=self.run.id, tags=tags).info.run_id
        # what decides the result: MLflow params cannot change, and paths, tags and tracking
        # may change from one launch of the run to the next
        pairs = [Param(k, v) for k, v in params(identity(config)).items()]
        for i in range(0, len(pairs), _BATCH):
            self.client.log_batch(run_id, params=pairs[i : i + _BATCH])
        kept = {"uri": self.uri, "experiment_id": experiment_id, "run_id": run_id}
        write_atomic(self.state, json.dumps(kept, indent=2) + "\n")
        return run_id

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another run created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _last_step(self) -> int:
        history = self.client.get_metric_history(self.id, "train/loss")
        return max((m.step for m in history), default=-1)

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        if step <= self.logged or not values:
            return
        now = int(time.time() * 1000)
        self.client.log_batch(self.id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def finish(self, files: list[Path]) -> None:
        for path in files:
            self.client.log_artifact(self.id, str(path))
        self.client.set_terminated(self.id, "FINISHED")

    def close(self) -> None:
        """Mark a run that did not finish: a later launch of the fwk run resumes it."""
        if self.client.get_run(self.id).info.status == "RUNNING":
            self.client.set_terminated(self.id, "KILLED")


class Tracking:
    """The sinks the Reporter forwards its rows to. They do nothing on every rank but 0."""

    def __init__(self, cfg: TrackingConfig, run: RunDir, is_main: bool) -> None:
        self.cfg, self.run, self.enabled = cfg, run, is_main
        self.tensorboard: TensorBoard | None = None
        self.mlflow: MLflow | None = None

    def start(self, step: int) -> None:
        """Open the sinks before training, from ``step`` on, where a resumed run continues."""
        if not self.enabled:
            return
        if self.cfg.tensorboard:
            self.tensorboard = TensorBoard(self.run.path / "tensorboard", step)
        if self.cfg.mlflow:
            with reaching(self.cfg.uri):
                self.mlflow = MLflow(self.cfg, self.run)

    def log(self, step: int, row: dict[str, Any], kind: str) -> None:
        if not self.enabled:
            return
        values = scalars(row, kind)
        if self.tensorboard is not None:
            self.tensorboard.log(step, values)
            if kind == "eval":  # TensorBoard shows the run up to its last evaluation
                self.tensorboard.flush()
        self._to_mlflow(lambda m: m.log(step, values))

    def finish(self) -> None:
        """Send the run's files to MLflow as artifacts, once the run is complete and
        summary.json is written."""
        if self.enabled and self.mlflow is not None:
            self._to_mlflow(lambda m: m.finish([*self._files(), *self._plot()]))

    def close(self) -> None:
        """Close the sinks (also after a stop or an error)."""
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        self._to_mlflow(MLflow.close)
        self.mlflow = None

    def _files(self) -> list[Path]:
        return [p for p in (self.run.config, self.run.summary, self.run.meta) if p.is_file()]

    def _plot(self) -> list[Path]:
        from fwk.track.plot import plot_runs

        return [plot_runs([self.run], self.run.path / "plots" / "metrics.png")]

    def _to_mlflow(self, call: Callable[[MLflow], None]) -> None:
        """Call MLflow, and on any error warn once and go on without it: the run matters more."""
        if self.mlflow is None:
            return
        try:
            call(self.mlflow)
        except Exception as exc:  # the server's trouble (or mlflow's) must not stop training
            self.mlflow = None
            logger.warning(
                f"fwk: warning: MLflow at {self.cfg.uri} failed ({_reason(exc)}); training goes on without it "
                "(metrics.jsonl and TensorBoard have everything)"
            )


def check_server(cfg: TrackingConfig) -> None:
    """Check, before any run dir exists, that the MLflow server answers when MLflow is on. If
    not, say in one line how to fix it."""
    if cfg.mlflow:
        with reaching(cfg.uri):
            _client(cfg.uri).search_experiments(max_results=1)


def _client(uri: str) -> Any:
    for name, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


@contextmanager
def reaching(uri: str) -> Iterator[None]:
    """Turn a missing mlflow package, or a failure to talk to its server, into one line
    saying how to fix it."""
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise UserError(
            "tracking=mlflow needs the mlflow package: pip install 'fwk[mlflow]' (or train with tracking=tensorboard)"
        ) from None
    try:
        yield
    except (MlflowException, OSError) as exc:
        raise UserError(
            f"cannot reach the MLflow server at {uri} ({_reason(exc)}); start it "
            "(mlflow server --host 127.0.0.1 --port 5000) and set tracking.uri, or train without it: "
            "tracking=tensorboard"
        ) from None


def _reason(exc: BaseException) -> str:
    """Give the gist of a long, nested error from mlflow or requests on one line."""
    text = " ".join(str(exc).split())
    errno = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if errno:
        return errno.group(1).strip()
    return text[:200] + ("..." if len(text) > 200 else "")
