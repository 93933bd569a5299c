"""SLURM: the launch settings a job's allocation implies, and the requeue of a preempted job.

``scripts/slurm/train.sbatch`` stays thin and asks this module, in the batch shell:

    python -m fwk.launch.slurm overrides ARGS...   # parallel.* overrides for `fwk train`, one a line
    python -m fwk.launch.slurm requeue ARGS...     # after a preemption notice: requeue the job,
                                                   # unless its run finished meanwhile

ARGS are the user's `fwk train` overrides (and, for ``requeue``, the launch overrides too).
The overrides are computed once, in the batch shell, so that every node gets the same
config and so the same run id and run dir.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fwk.errors import UserError

# The rendezvous port is derived from the job id, so that two jobs that share their first
# node do not collide; it stays the same when the job is requeued (the id does not change).
RDZV_PORT_BASE, RDZV_PORT_SPAN = 15000, 10000
# Exit status of a launch stopped by SIGUSR1 (128 + 10), as fwk/launch/supervise.py returns it.
PREEMPTED_STATUS = 138


def _key(override: str) -> str:
    """Return the config key an override sets: `++parallel.nnodes=2` -> `parallel.nnodes`."""
    return override.partition("=")[0].lstrip("+~")


def num_nodes(env: Mapping[str, str]) -> int:
    value = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    if not value:
        raise UserError("SLURM_JOB_NUM_NODES is not set: run this inside a SLURM job (sbatch or salloc)")
    return int(value)


def gpus_per_node(env: Mapping[str, str]) -> int:
    """Count the GPUs allocated on this node: SLURM_GPUS_ON_NODE, else --gpus-per-node
    (`a100:4` -> 4)."""
    on_node = env.get("SLURM_GPUS_ON_NODE")
    if on_node:
        return int(on_node)
    per_node = env.get("SLURM_GPUS_PER_NODE")
    if per_node:  # "4", "a100:4" or "a100:2,v100:2"
        return sum(int(part.rsplit(":", 1)[-1]) for part in per_node.split(","))
    return 0


def first_host(nodelist: str) -> str:
    """Return the first host of a SLURM node list (`node[03-05],gpu1` -> `node03`), by scontrol."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserError(f"cannot expand the node list {nodelist!r} with `scontrol show hostnames`: {exc}") from None
    return out.stdout.split()[0]


def rdzv_port(env: Mapping[str, str]) -> int:
    return RDZV_PORT_BASE + int(env["SLURM_JOB_ID"]) % RDZV_PORT_SPAN


def _allows(nnodes: str, allocated: int) -> bool:
    """Tell whether ``parallel.nnodes`` as typed, ``2`` or an elastic range ``1:2``, admits
    this allocation."""
    low, sep, high = nnodes.partition(":")
    try:
        return int(low) <= allocated <= int(high) if sep else int(nnodes) == allocated
    except ValueError:
        return False  # not a count: the config check names it


def overrides(env: Mapping[str, str], args: Sequence[str], host: Callable[[str], str] = first_host) -> list[str]:
    """Give the `fwk train` overrides for this allocation: nodes, processes per node and
    rendezvous.

    One process per GPU of a node (one per node on CPU); torchrun's c10d rendezvous on the
    first host of the allocation. A key the user gives in ``args`` wins, but for
    ``parallel.nnodes``, which must match the allocation (the rendezvous would wait forever).
    """
    given = {_key(a): a.partition("=")[2] for a in args}
    nnodes = num_nodes(env)
    if "parallel.nnodes" in given and not _allows(given["parallel.nnodes"], nnodes):
        raise UserError(
            f"parallel.nnodes={given['parallel.nnodes']} but the job has {nnodes} node(s); "
            f"drop parallel.nnodes (it is read from SLURM) or submit with "
            f"sbatch --nodes={given['parallel.nnodes'].replace(':', '-')}"
        )
    out = [f"parallel.nnodes={nnodes}"] if "parallel.nnodes" not in given else []
    if "parallel.nproc_per_node" not in given:
        out.append(f"parallel.nproc_per_node={gpus_per_node(env) or 1}")
    if nnodes > 1 and "parallel.rdzv_endpoint" not in given:
        nodelist = env.get("SLURM_JOB_NODELIST") or env["SLURM_NODELIST"]
        out.append(f"parallel.rdzv_endpoint={host(nodelist)}:{rdzv_port(env)}")
    return out


def requeue_target(env: Mapping[str, str]) -> str:
    """Return what `scontrol requeue` takes for this job: `<array job>_<task>` for an array task."""
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    if not env.get("SLURM_JOB_ID"):
        raise UserError("SLURM_JOB_ID is not set: run this inside a SLURM job")
    return env["SLURM_JOB_ID"]


def _run_dir(args: Sequence[str]) -> Path:
    """Return the run dir `fwk train ARGS` uses, by the same composition as fwk/cli/train.py."""
    from fwk.config.resolve import resolve
    from fwk.launch.launcher import plan

    return plan(resolve(list(args))).run_dir


def _latest_checkpoint(run_dir: Path) -> str:
    names = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*") if (p / "manifest.json").exists())
    return names[-1] if names else "no checkpoint"


def requeue(
    env: Mapping[str, str],
    args: Sequence[str],
    run_dir: Callable[[Sequence[str]], Path] = _run_dir,
    scontrol: Callable[[list[str]], int] = lambda argv: subprocess.run(argv).returncode,
) -> int:
    """Requeue this job so that it resumes its run, unless the run is complete, and return the
    exit status."""
    from fwk.track.store import RunDir

    run = RunDir(run_dir(args))
    if run.read_summary() is not None:
        print(f"fwk: run {run.id} is complete; the job is not requeued", flush=True)
        return 0
    target = requeue_target(env)
    restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
    # Said first: slurmctld ends this batch shell as soon as the requeue is accepted.
    print(
        f"fwk: run {run.id} stopped ({_latest_checkpoint(run.path)}); requeueing job {target} "
        f"(restart {restarts + 1}): it resumes from that checkpoint",
        flush=True,
    )
    status = scontrol(["scontrol", "requeue", target])
    if status != 0:
        print(f"fwk: error: `scontrol requeue {target}` failed (exit {status}); resubmit the job", file=sys.stderr)
        return PREEMPTED_STATUS
    return 0


def main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "overrides":
        print("\n".join(overrides(env, args)))
        return 0
    if command == "requeue":
        return requeue(env, args)
    print("usage: python -m fwk.launch.slurm {overrides|requeue} [FWK_TRAIN_ARGS...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    import os

    try:
        sys.exit(main(sys.argv[1:], os.environ))
    except UserError as exc:
        print(f"fwk: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
