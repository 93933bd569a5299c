"""A real single-node SLURM cluster for the tests that submit jobs (scripts/slurm/cluster.sh)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts/slurm/cluster.sh"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "srun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """Starts munged, slurmctld and slurmd for this session; yields the environment to use it."""
    path = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    missing = [b for b in BINARIES if shutil.which(b, path=path) is None]
    require(not missing, f"SLURM is not installed (no {', '.join(missing)}); `make slurm` installs it (as root)")
    require(os.geteuid() == 0, "a test SLURM cluster needs root (slurmd starts the job steps)")
    # Not under pytest's tmp dir: munged wants every parent of its socket enterable by all.
    where = Path(tempfile.mkdtemp(prefix="fwk-slurm-", dir="/tmp"))
    env = {**os.environ, "PATH": path, "SLURMCTLD_PORT": str(_free_port()), "SLURMD_PORT": str(_free_port())}
    started = subprocess.run(
        ["bash", str(CLUSTER), "start", str(where)], env=env, capture_output=True, text=True, timeout=120
    )
    if started.returncode != 0:
        subprocess.run(["bash", str(CLUSTER), "stop", str(where)], env=env, capture_output=True, timeout=120)
        pytest.fail(f"the test SLURM cluster did not start:\n{started.stdout}{started.stderr}")
    try:
        yield {**env, "SLURM_CONF": str(where / "slurm.conf")}
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(where)], env=env, capture_output=True, timeout=120)
        shutil.rmtree(where, ignore_errors=True)
