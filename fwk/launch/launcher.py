"""From a resolved config to running workers. First comes the plan: run id, run dir, and
whether torchrun runs it. Then the run dir is opened and the workers run in this process or
under torchrun."""

from __future__ import annotations

import copy
import json
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.config.layouts import describe as describe_layout
from fwk.config.resolve import Resolved
from fwk.config.schema import Config
from fwk.launch.guard import guarded
from fwk.launch.supervise import run_torchrun
from fwk.launch.torchrun import torchrun_argv
from fwk.track import index, startup
from fwk.track.lease import launch_key
from fwk.track.run_id import code_version, run_id
from fwk.track.status import record_outcome
from fwk.track.store import RunDir, RunLock, make_run_dir, open_run, write_atomic

logger = logging.getLogger(__name__)


@dataclass
class LaunchPlan:
    """What a launch will do. ``--dry-run`` prints it and stops."""

    run_id: str
    run_dir: Path
    code: str
    world_size: int
    nproc_per_node: int
    argv: list[str] | None  # torchrun's command line, or None for one in-process worker
    data: dict[str, str]  # the data's fingerprint (sources.Fingerprint), or why there is none
    lease_key: str | None = None  # several machines: the launch that holds the run's lease (fwk/track/lease.py)
    layout: str = ""  # the mesh and its per-rank memory estimate (fwk/config/layouts.py)

    def describe(self) -> str:
        how = shlex.join(self.argv) if self.argv else "in this process (1 worker)"
        return (
            f"run {self.run_id} -> {self.run_dir}\ncode {self.code}, world size {self.world_size}\n"
            + (f"{self.layout}\n" if self.layout else "")
            + f"data {self.data['digest'] or '-'}: {self.data['what']}"
            + (f"; {self.data['how']}" if self.data.get("how") else "")
            + f"\nlaunch: {how}"
        )


def data_fingerprint(data: Any) -> dict[str, str]:
    """Describe what the run's data is, as a digest that enters the run id (see fwk/data/sources.py)."""
    if hasattr(data, "fingerprint"):
        return data.fingerprint().to_dict()
    if getattr(data, "name", None) == "synthetic":
        return {"digest": "", "what": "generated from the data config"}
    # data=custom is the user's own function, kept as its dict of keys: name it by its target
    name = data.get("_target_") if isinstance(data, dict) else getattr(data, "name", type(data).__name__)
    return {"digest": "", "what": f"not fingerprinted: fwk cannot see what data '{name}' reads"}


def plan(resolved: Resolved, salt: str = "") -> LaunchPlan:
    """Plan where ``resolved`` runs and how. ``salt`` makes a run of the same config another
    run, as a replay is."""
    cfg = resolved.config
    code = code_version()
    data = data_fingerprint(cfg.data)
    rid = run_id(resolved.as_dict, code, data["digest"], salt)
    run_dir = Path(cfg.paths.runs).expanduser().resolve() / rid
    argv = torchrun_argv(cfg.parallel, run_dir, rid) if cfg.world_size > 1 else None
    key = launch_key(cfg.parallel.rdzv_endpoint, os.environ) if cfg.parallel.nnodes > 1 else None
    mesh = describe_layout(cfg) if cfg.world_size > 1 else ""
    return LaunchPlan(rid, run_dir, code, cfg.world_size, cfg.parallel.nproc_per_node, argv, data, key, mesh)


def launch(
    p: LaunchPlan,
    config_yaml: str,
    nnodes: int,
    lineage: dict[str, str] | None = None,
    overrides: list[str] | None = None,
    orders: dict[str, Any] | None = None,
    typed: Config | None = None,
) -> tuple[int, RunDir]:
    """Run the plan, and return the exit status and the run dir. torchrun's status is passed
    through. ``lineage`` and ``overrides`` are recorded in meta.json (see ``open_run``).
    ``orders``, such as ``--redecide`` or a replay's decisions, go to this launch's workers
    through the run dir. They are written on every launch, so that none outlives the launch
    that gave it. ``typed`` is ``config_yaml`` as the typed config, which a worker in this
    process then need not read back and validate again."""
    first = {**(lineage or {}), "data": p.data}
    run = make_run_dir(p.run_dir.parent, p.run_id)
    # Each machine's launcher opens the same shared run dir in a multi-node run, and their
    # guard is a lease in that dir. A run on one machine is locked there. A launch that is
    # refused writes nothing.
    with guarded(run, nnodes, p.lease_key or "") as held:
        run = open_run(p.run_dir.parent, p.run_id, config_yaml, p.code, p.world_size, first, overrides)
        if orders:
            write_atomic(run.orders, json.dumps(orders, indent=2) + "\n")
        else:  # none outlives the launch that gave it
            run.orders.unlink(missing_ok=True)
        index.record_quietly(run, "running")
        status, outcome = 1, "failed"
        try:
            if p.argv is None:
                from fwk.launch.worker import run_worker

                startup.mark("launch")
                # the worker in this process trains the config already typed, unless the run
                # dir's record differs from it (a relaunch keeps the first launch's settings)
                same = typed is not None and run.config.read_text() == config_yaml
                status = run_worker(run.path, copy.deepcopy(typed) if same else None)
            else:
                # torchrun's agent holds the lock too
                keep = (held.fileno(),) if isinstance(held, RunLock) else ()
                status = run_torchrun(p.argv, run.path / "logs", p.nproc_per_node, keep)
            # A clean exit without a summary is a run stopped at a step boundary by Ctrl-C or SIGTERM.
            # 128 + N: the launcher or torchrun's agent got signal N, and the run resumes from its checkpoint.
            if status == 0:
                outcome = "complete" if run.summary.is_file() else "interrupted"
            else:
                outcome = "interrupted" if status >= 128 else "failed"
        except KeyboardInterrupt:
            outcome = "interrupted"
            raise
        finally:
            _record_end(run, outcome, status)
        return status, run


def _record_end(run: RunDir, outcome: str, status: int) -> None:
    """Record how the launch ended in meta.json, the truth a rebuilt index reads, and in the index."""
    try:
        record_outcome(run, outcome, status)
    except OSError as exc:
        logger.warning(f"fwk: warning: could not note the outcome in {run.meta}: {exc}")
    index.record_quietly(run, outcome)
