"""Shared helpers: run the real `fwk` command in a subprocess with its own runs root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter (fp32 and fp16; it has no bf16).
# Set before any kernel module is imported: triton.jit reads it when a kernel is defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def run_fwk(*args: str, runs: Path, timeout: float = 300, **popen: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "FWK_RUNS": str(runs), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "fwk", *args], capture_output=True, text=True, timeout=timeout, env=env, **popen
    )


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def require(condition: bool, reason: str) -> None:
    """Skip when a dependency is missing, but fail in CI (CI=true), where everything must run."""
    if not condition:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: this test must run in CI)")
        pytest.skip(reason)
