"""A run dir: ``runs/<id>/`` with config.yaml, meta.json, metrics.jsonl, summary.json, checkpoints/."""

from __future__ import annotations

import fcntl
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fwk.distributed.dims import LAYOUT
from fwk.errors import UserError
from fwk.track.run_id import identity


def cache_root() -> Path:
    """Return fwk's per-user cache: ``$XDG_CACHE_HOME/fwk``, by default ``~/.cache/fwk``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "fwk"


def write_atomic(path: Path, text: str) -> None:
    """Write a file so that readers see the old content or the new, never half of it."""
    # The temp name is the writer's own: the launchers of a multi-node run share the run dir.
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)  # the rename itself survives a power loss once its folder is synced
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def meta(self) -> Path:
        return self.path / "meta.json"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def orders(self) -> Path:
        """Return the file of what this launch asks of its workers, such as ``--redecide`` or a
        replay's decisions. The launcher writes it on every launch, under the run's lock
        (``fwk/launch/launcher.py``)."""
        return self.path / "orders.json"

    def read_orders(self) -> dict[str, Any]:
        """Read this launch's orders. There are none where the run dir has no such file, as for
        a run in a test's dir."""
        try:
            orders = json.loads(self.orders.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError:
            raise UserError(
                f"{self.orders} is not valid JSON; delete it (fwk train writes it on every launch)"
            ) from None
        return orders if isinstance(orders, dict) else {}

    def read_summary(self) -> dict[str, Any] | None:
        """Return the summary of a finished run, or None while it has not finished."""
        try:
            return json.loads(self.summary.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError:
            raise UserError(f"{self.summary} is not valid JSON; delete it to re-run the last evaluation") from None

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(self.summary, json.dumps(summary, indent=2) + "\n")

    def metrics_rows(self) -> Iterator[dict[str, Any]]:
        yield from self._metrics()[0]

    def _metrics(self) -> tuple[list[dict[str, Any]], str]:
        """Return the rows of metrics.jsonl and its torn last line, or "" when none is torn. A
        run cut off mid-write, by power loss or a full disk, can leave half a line at the end,
        never in the middle."""
        if not self.metrics.exists():
            return [], ""
        lines = [line for line in self.metrics.read_text(errors="replace").splitlines() if line.strip()]
        rows = []
        for k, line in enumerate(lines):
            try:
                rows.append(json.loads(line))
            except ValueError:
                if k < len(lines) - 1:
                    raise UserError(
                        f"{self.metrics}: line {k + 1} of {len(lines)} is not JSON ({line[:60]!r}); only the last line "
                        "can be torn by a crash: move the file away to resume without its history"
                    ) from None
                return rows, line
        return rows, ""

    def truncate_metrics(self, after_step: int) -> str | None:
        """Drop rows logged after ``after_step``, since a resumed run logs them again, and a
        torn last line. Return one line saying so when there was one."""
        if not self.metrics.exists():
            return None
        rows, torn = self._metrics()
        kept = [json.dumps(r) for r in rows if r.get("step", 0) <= after_step]
        write_atomic(self.metrics, "".join(line + "\n" for line in kept))
        if torn:
            return (
                f"metrics.jsonl: dropped its torn last line ({len(torn)} characters, cut off mid-write): {torn[:60]!r}"
            )
        return None

    def set_metrics_aside(self) -> str | None:
        """Move the rows of an earlier attempt aside when the run starts again from step 0 (its
        checkpoints moved away or never written): its new rows would otherwise follow rows of
        the same steps. Return one line saying where they went, when there were any."""
        rows, _ = self._metrics() if self.metrics.exists() else ([], "")
        if not rows:
            self.metrics.unlink(missing_ok=True)
            return None
        k = 1
        while (aside := self.metrics.with_name(f"metrics.jsonl.restart-{k}")).exists():
            k += 1
        os.replace(self.metrics, aside)
        return (
            f"metrics.jsonl: no checkpoint to resume from, so the run starts at step 0; the {len(rows)} rows of its "
            f"earlier attempt (to step {max(r.get('step', 0) for r in rows)}) are kept in {aside.name}"
        )


# The packages whose version can change what a run computes or how it is launched.
PACKAGES = ("fwk", "torch", "torchvision", "triton", "numpy", "scikit-learn", "hydra-core", "omegaconf")


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Return Python's version and those of the ``packages`` that are installed."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def _same_run(stored_yaml: str, config_yaml: str) -> bool:
    """Tell whether two resolved configs are one run: equal but for what the run id leaves out.
    That is storage paths, tags, tracking and the rendezvous host of a job requeued onto other
    nodes."""
    if stored_yaml == config_yaml:
        return True
    try:
        stored = yaml.safe_load(stored_yaml)
    except yaml.YAMLError:
        return False
    return isinstance(stored, dict) and identity(stored) == identity(yaml.safe_load(config_yaml))


# What the workers read from config.yaml that the run id leaves out and a relaunch may change:
# the process counts and layout, and how long a collective or a rendezvous waits, and for how
# few machines (a job resubmitted with a longer timeout must get it)
_AS_LAUNCHED_PARALLEL = ("nproc_per_node", "nnodes", "min_nnodes", "rdzv_last_call_s", "collective_timeout_s", *LAYOUT)


def _tracked_as_launched(stored_yaml: str, config_yaml: str) -> str | None:
    """Return the stored config with this launch's ``tracking`` section and process counts, or
    None when they agree.

    The run id leaves both out, so a run interrupted under one tracking resumes under
    another, and on another number of processes: the workers read config.yaml, and must send
    the results where this launch says, on as many processes as it starts.
    """
    if stored_yaml == config_yaml:
        return None
    stored, launched = yaml.safe_load(stored_yaml), yaml.safe_load(config_yaml)
    parallel = dict(stored.get("parallel") or {})
    parallel.update({k: v for k, v in (launched.get("parallel") or {}).items() if k in _AS_LAUNCHED_PARALLEL})
    if stored.get("tracking") == launched.get("tracking") and parallel == (stored.get("parallel") or {}):
        return None
    from omegaconf import OmegaConf

    relaunched = {**stored, "tracking": launched.get("tracking")}
    if parallel:
        relaunched["parallel"] = parallel
    return OmegaConf.to_yaml(relaunched)


def make_run_dir(root: Path, run_id: str) -> RunDir:
    """Return the run dir, created if new. It is empty then, and ``open_run`` fills it."""
    run = RunDir(root / run_id)
    try:
        run.path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create run dir {run.path}: {exc.strerror}; set paths.runs=... or FWK_RUNS") from None
    return run


def open_run(
    root: Path,
    run_id: str,
    config_yaml: str,
    code: str,
    world_size: int,
    first: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
) -> RunDir:
    """Create the run dir (or reopen it), and record this launch in meta.json.

    ``first`` is recorded when the run dir is created and kept after: its lineage
    (``parent``: the run it replays or derives from, ``sweep``: the sweep that launched it,
    ``kind``: replay, sweep) and ``data``: its data's fingerprint. ``overrides`` are this
    launch's command-line overrides as typed.
    """
    run = make_run_dir(root, run_id)
    if run.config.exists() and not _same_run(run.config.read_text(), config_yaml):
        raise UserError(
            f"{run.config} differs from this command's config though the run id matches; "
            f"move {run.path} away (it was edited by hand) and run again"
        )
    if not run.config.exists():
        write_atomic(run.config, config_yaml)
    elif (relaunched := _tracked_as_launched(run.config.read_text(), config_yaml)) is not None:
        write_atomic(run.config, relaunched)
    meta = (
        json.loads(run.meta.read_text())
        if run.meta.exists()
        else {
            "run_id": run_id,
            "code": code,
            "versions": versions(),
            "world_size": world_size,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "launches": [],
            **(first or {}),
        }
    )
    launch = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(), "argv": sys.argv}
    if overrides is not None:
        launch["overrides"] = list(overrides)
    meta["launches"].append(launch)
    write_atomic(run.meta, json.dumps(meta, indent=2) + "\n")
    return run


def flock_holders(path: Path) -> list[int] | None:
    """Return the pids that hold a flock on ``path``, from /proc/locks on Linux. Return None
    where it cannot be read.

    A line reads "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF" (a blocked waiter has
    "->" after "1:"); the pid is the process that took the lock.
    """
    try:
        st = path.stat()
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    pids = []
    for line in text.splitlines():
        parts = line.split()
        if "FLOCK" not in parts or "->" in parts:
            continue
        dev_ino = next((p for p in parts if p.count(":") == 2), None)
        if dev_ino is None:
            continue
        major, minor, ino = dev_ino.split(":")
        try:
            if int(ino) == st.st_ino and os.makedev(int(major, 16), int(minor, 16)) == st.st_dev:
                pids.append(int(parts[parts.index(dev_ino) - 1]))
        except ValueError:
            continue
    return pids


def _process(pid: int) -> str:
    """Name ``pid`` and its command line, for a one-line message."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"process {pid}"
    return f"process {pid} ({' '.join(os.fsdecode(a) for a in argv if a)[:120]})"


def _lock_users(path: Path) -> list[int]:
    """List the live processes that hold the flock on ``path``. That is the one that took it,
    from /proc/locks. Once that one is gone, it is those that inherited it, such as torchrun's
    agent, whose descriptor is open."""
    alive = [pid for pid in flock_holders(path) or [] if Path(f"/proc/{pid}").exists()]
    if alive:
        return alive
    users = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == str(path) for fd in fd_dir.iterdir()):
                users.append(int(fd_dir.parent.name))
        except OSError:
            continue
    return sorted(users)


class RunLock:
    """An exclusive lock on a run dir, so two launches of one run cannot interleave. The
    launcher holds it until no process of the run is left (fwk/launch/supervise.py)."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._file = None

    def __enter__(self) -> RunLock:
        self._file = open(self.run.path / ".lock", "w")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            holders = _lock_users(self.run.path / ".lock")
            who = _process(holders[0]) if holders else "another process"
            raise UserError(
                f"run {self.run.id} is already running in {who} ({self.run.path}); "
                "wait for it to finish, or change a setting to start a different run"
            ) from None
        return self

    def fileno(self) -> int:
        """Return the locked descriptor. A process that inherits it holds the lock until it exits."""
        assert self._file is not None, "not entered"
        return self._file.fileno()

    def __exit__(self, *exc: object) -> None:
        assert self._file is not None
        self._file.close()  # not LOCK_UN: that would release it for a process that inherited it too
