"""The torchrun command line that starts every worker of a run."""

from __future__ import annotations

import sys
from pathlib import Path

from fwk.config.schema import ParallelConfig

# Worker-group restarts of an elastic run that sets no parallel.max_restarts: each lost
# machine takes one (its survivors re-rendezvous and resume from the last checkpoint)
ELASTIC_RESTARTS = 3


def torchrun_argv(p: ParallelConfig, run_dir: Path, run_id: str) -> list[str]:
    """Build ``python -m torch.distributed.run ... -m fwk.launch.worker <run_dir>``.

    torchrun is started through this interpreter so that it runs in fwk's environment
    even when the ``torchrun`` script is not on PATH.
    """
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={p.nproc_per_node}"]
    elastic = 0 < p.min_nnodes < p.nnodes
    restarts = p.max_restarts or (ELASTIC_RESTARTS if elastic else 0)
    if restarts:
        argv.append(f"--max-restarts={restarts}")
    if p.nnodes == 1:
        # One machine: torchrun picks a free port itself, so parallel runs do not collide.
        argv.append("--standalone")
    else:
        argv += [
            f"--nnodes={p.min_nnodes}:{p.nnodes}" if elastic else f"--nnodes={p.nnodes}",
            f"--rdzv-backend={p.rdzv_backend}",
            f"--rdzv-endpoint={p.rdzv_endpoint}",
            f"--rdzv-id={run_id}",
        ]
        if p.rdzv_backend == "static":
            argv.append(f"--node-rank={p.node_rank}")
        if elastic:  # a machine that stops answering leaves the rendezvous after its keep-alives lapse
            argv.append(f"--rdzv-conf=last_call_timeout={p.rdzv_last_call_s},keep_alive_interval=2")
    return [*argv, "-m", "fwk.launch.worker", str(run_dir)]
