"""A worker, ``python -m fwk.launch.worker <run_dir>``, which torchrun starts on every rank.

It reads the resolved config from the run dir and never calls Hydra's composition.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from fwk.config.schema import Config
from fwk.config.validate import to_typed
from fwk.errors import UserError
from fwk.launch.supervise import die_with_agent, redirect_worker_output
from fwk.log import show
from fwk.track import startup
from fwk.track.store import RunDir


def run_worker(run_dir: Path, cfg: Config | None = None) -> int:
    """Train the run in this process. Return 0 when it finished or stopped cleanly.

    ``cfg`` is the run dir's config already typed, as the launcher of a one-process run has
    it. Without it the worker reads the recorded config and validates it."""
    from fwk.components.sinks import Tracking
    from fwk.distributed.group import shutdown
    from fwk.engine.assemble import build_run
    from fwk.engine.trainer import train
    from fwk.track import startup

    startup.mark("imports")
    redirect_worker_output(int(os.environ.get("RANK", "0")))  # under torchrun: into runs/<id>/logs/
    run = RunDir(Path(run_dir))
    if cfg is None:
        cfg = to_typed(OmegaConf.to_container(OmegaConf.load(run.config), resolve=True))
    is_main = os.environ.get("RANK", "0") == "0"
    tracking = Tracking(cfg.tracking, run, is_main)
    startup.mark("tracking")
    clean = False
    try:
        summary = train(build_run(cfg, run, tracking))  # rank 0 writes summary.json
        if summary is not None and is_main:
            tracking.finish()  # summary.json is on disk: the artifacts go to MLflow
        clean = True
    finally:
        tracking.close()
        shutdown(clean)
        startup.restart()  # a sweep's next run in this process counts its start-up from here
    return 0


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m fwk.launch.worker <run_dir>")
    die_with_agent()  # before anything else: a worker whose torchrun is gone must not train
    startup.mark("python")
    show(rank=int(os.environ.get("RANK", "0")))  # rank 0's report lines, every rank's warnings
    try:
        code = run_worker(Path(sys.argv[1]))
    except UserError as exc:
        # every rank says it, into its own log under fwk's launcher: whichever rank torchrun
        # stops first, the launcher finds the line
        print(f"fwk: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    # Everything is on disk (checkpoints and summary fsynced, metrics closed). Skip the
    # interpreter's teardown: gloo's threads can still hold tensors then, and freeing them
    # without a live interpreter aborts the process ("terminate called without an active
    # exception", SIGABRT) after a run that finished fine.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
