"""Shared helpers: run the real `fwk` command in a subprocess with its own runs root."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

# One intra-op thread in the test processes: pytest, and each `fwk` it starts (they inherit
# the environment; fwk's launcher sets its own count for torchrun's ranks). The tests' models
# are tiny, and on a 2-core machine that something else also uses, two OpenMP threads spin
# waiting for each other: a step of the digits CNN took 212 ms instead of 26 ms. Setting
# OMP_NUM_THREADS before running pytest overrides this.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Every test sees the same CPU, whatever machine runs the suite: one without bf16 units
# (fwk/strategies/hardware.py reads FWK_CPU_BF16; the `fwk` commands the tests start inherit it).
# The bf16 paths run explicitly with FWK_CPU_BF16=1 (`both_cpus` below, or monkeypatch.setenv);
# `FWK_CPU_BF16=1 make test` runs the whole suite as on a CPU with bf16 units.
os.environ.setdefault("FWK_CPU_BF16", "0")

# Without a GPU, Triton kernels run in Triton's interpreter (fp32 and fp16; it has no bf16).
# Set before any kernel module is imported: triton.jit reads it when a kernel is defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests import zygote  # noqa: E402  (its fork server starts with the variables above)


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The report lines fwk logs (fwk/log.py) during the test: ``said.messages``, in order;
    ``said.clear()`` forgets them."""
    caplog.set_level(logging.INFO, logger="fwk")
    return caplog


@pytest.fixture(autouse=True)
def decision_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own cache of measured decisions (fwk/strategies/decisions.py): nothing
    is read from or written to the user's ~/.cache, and no test reuses another's timings.
    The `fwk` commands a test starts share it, as two runs on one machine would."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache / "fwk" / "decisions"


def run_fwk(*args: str, runs: Path, timeout: float = 300, **popen: object) -> subprocess.CompletedProcess:
    """``fwk ARGS`` with its own runs root, as ``subprocess.run`` with output captured. The
    command is forked from a process that imported torch and fwk once (tests/zygote.py)."""
    env = {**os.environ, "FWK_RUNS": str(runs), "PYTHONUNBUFFERED": "1"}
    return zygote.run(list(args), env, timeout, **popen)


def interrupt_after(
    args: list[str], runs: Path, pattern: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Start ``fwk ARGS``, Ctrl-C it once a file matching ``pattern`` appears under ``runs``
    (e.g. a checkpoint's manifest), and return what it printed and its exit code."""
    env = {**(env or os.environ), "FWK_RUNS": str(runs), "PYTHONUNBUFFERED": "1"}
    proc = zygote.popen(args, env)
    deadline = time.monotonic() + timeout
    while not list(runs.glob(pattern)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def resumes_bit_exactly(
    args: list[str], tmp_path: Path, final_step: int, stop_when: str = "*/checkpoints/step-*/manifest.json"
) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Train ``fwk ARGS`` straight through, and again Ctrl-C'd once ``stop_when`` appears,
    then resumed; assert the two runs' final weights and evaluations are equal. Returns the
    straight run's output and both run dirs, for the caller's own checks."""
    from fwk.components.checkpoint import model_weights

    straight = run_fwk(*args, runs=tmp_path / "straight", timeout=600)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    stopped = interrupt_after(args, tmp_path / "stopped", stop_when)
    assert stopped.returncode in (0, 130) and "resumed" not in stopped.stdout, stopped.stdout + stopped.stderr
    resumed = run_fwk(*args, runs=tmp_path / "stopped", timeout=600)
    assert resumed.returncode == 0 and "resumed run" in resumed.stdout, resumed.stdout + resumed.stderr
    (first,), (second,) = (tmp_path / "straight").glob("*/"), (tmp_path / "stopped").glob("*/")
    final = f"checkpoints/step-{final_step:08d}"
    expected, got = model_weights(first / final), model_weights(second / final)
    assert expected.keys() == got.keys() and all(torch.equal(got[k], v) for k, v in expected.items())
    summaries = [json.loads((run / "summary.json").read_text())["eval"] for run in (first, second)]
    assert summaries[0] == summaries[1]
    return straight, first, second


# pytest-xdist (`-n auto --dist loadgroup`, pyproject.toml) hands out units of work whole. A
# test is a unit of its own, so that the two workers share the long ones; the tests of a file
# that builds a fixture once per module (or whose conftest.py does) are one unit, so that it is
# built once; the files that share a session fixture (the SLURM cluster, the served exports,
# the exported digits run) are one. The units are made here, in the controller, from the test
# ids: xdist's own way (an `@group` suffix it writes into the id on each worker) does nothing
# since pytest 9.2 (pytest-dev/pytest-xdist#1386).
SHARED_SESSION = {"launch/test_slurm.py": "slurm", "serve/": "serve", "export/": "export"}
TESTS = Path(__file__).parent
BUILT_ONCE = re.compile(r"""@pytest\.fixture\(scope=["'](module|package|session)["']""")


@functools.cache
def _builds_once(rel: str) -> bool:
    """Whether the test file ``rel`` (relative to tests/) uses fixtures built once per module:
    one defined in the file or in a conftest.py of its folders."""
    files = [TESTS / rel] + [TESTS / parent / "conftest.py" for parent in Path(rel).parents if parent.parts]
    return any(f.is_file() and BUILT_ONCE.search(f.read_text()) for f in files)


def unit_of(nodeid: str) -> str:
    """The unit of work a test id belongs to (see above)."""
    rel = nodeid.split("::", 1)[0].removeprefix("tests/")
    shared = next((g for prefix, g in SHARED_SESSION.items() if rel.startswith(prefix)), None)
    return shared or (rel if _builds_once(rel) else nodeid)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return Units(config, log)


@pytest.fixture
def cpu_bf16(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The CPU probe set to one side for this test and the `fwk` commands it starts: True,
    a CPU with bf16 units (precision=auto picks bf16, channels-last on conv nets); False,
    one without (fp32). Parametrize with ``both_cpus``."""
    monkeypatch.setenv("FWK_CPU_BF16", "1" if request.param else "0")
    return request.param


# Runs a test once as on a CPU without bf16 units and once as on one with them: for the
# end-to-end paths whose strategies follow precision=auto's choice.
both_cpus = pytest.mark.parametrize("cpu_bf16", [False, True], ids=["cpu-fp32", "cpu-bf16"], indirect=True)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def require(condition: bool, reason: str) -> None:
    """Skip when a dependency is missing, but fail in CI (CI=true), where everything must run."""
    if not condition:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: this test must run in CI)")
        pytest.skip(reason)
