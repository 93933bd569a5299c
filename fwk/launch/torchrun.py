"""The torchrun command line that starts every worker of a run."""

from __future__ import annotations

import sys
from pathlib import Path

from fwk.config.schema import ParallelConfig


def torchrun_argv(p: ParallelConfig, run_dir: Path, run_id: str) -> list[str]:
    """``python -m torch.distributed.run ... -m fwk.launch.worker <run_dir>``.

    torchrun is started through this interpreter so that it runs in fwk's environment
    even when the ``torchrun`` script is not on PATH.
    """
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={p.nproc_per_node}"]
    if p.max_restarts:
        argv.append(f"--max-restarts={p.max_restarts}")
    if p.nnodes == 1:
        # One machine: torchrun picks a free port itself, so parallel runs do not collide.
        argv.append("--standalone")
    else:
        argv += [
            f"--nnodes={p.nnodes}",
            f"--rdzv-backend={p.rdzv_backend}",
            f"--rdzv-endpoint={p.rdzv_endpoint}",
            f"--rdzv-id={run_id}",
        ]
        if p.rdzv_backend == "static":
            argv.append(f"--node-rank={p.node_rank}")
    return [*argv, "-m", "fwk.launch.worker", str(run_dir)]
