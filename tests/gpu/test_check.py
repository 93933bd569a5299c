"""benchmarks/gpu/check.py (make gpu-check): each part on its budget, statuses, the report, and
the whole dry run on the CPU, so that the command works on the first GPU machine it meets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu.check import only_skipped, run_all, verdict
from benchmarks.gpu.part import Part
from benchmarks.gpu.parts import PARTS, WIDE

ROOT = Path(__file__).resolve().parents[2]

PY = sys.executable


def _py(code: str) -> list[str]:
    return [PY, "-c", code]


def _gone(pid: int) -> bool:
    """No such process, or a zombie (killed, not yet reaped by whoever adopted it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _starts_child(pid_file: Path, then: str, session: bool = False) -> list[str]:
    """A part that starts a sleeping child (in a session of its own, as torchrun's are), then ``then``."""
    return _py(
        "import subprocess, sys, time; "
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session={session}); "
        f"open({str(pid_file)!r}, 'w').write(str(c.pid)); print('started', flush=True); {then}"
    )


def _wait_gone(pid_file: Path) -> bool:
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(child):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_part_over_its_budget_is_killed_with_its_children_and_the_next_still_runs(tmp_path: Path) -> None:
    slow, leaves = tmp_path / "slow.pid", tmp_path / "leaves.pid"
    parts = [
        Part("slow", "speed", "overruns", 5, _starts_child(slow, "time.sleep(60)", session=True)),
        Part("leaves", "speed", "exits, its child still running", 30, _starts_child(leaves, "print('ok: left')")),
        Part("next", "speed", "runs after them", 30, _py("print('ok: next ran')")),
    ]
    t0 = time.monotonic()
    results, md = run_all(parts, dry=False, out=tmp_path / "report")
    assert time.monotonic() - t0 < 30
    assert [(r.name, r.status) for r in results] == [("slow", "over budget"), ("leaves", "ok"), ("next", "ok")]
    assert results[0].reason == "killed after its budget of 5 s" and "started" in results[0].output
    assert 5 <= results[0].seconds < 15 and results[2].reason == "ok: next ran"
    assert _wait_gone(slow), "the overrunning part's child (in a session of its own) outlived it"
    assert _wait_gone(leaves), "a finished part's child was left running into the next part"
    text = md.read_text()
    assert "| speed | slow | over budget |" in text and "| speed | next | ok |" in text
    doc = json.loads(md.with_suffix(".json").read_text())
    assert [r["status"] for r in doc["results"]] == ["over budget", "ok", "ok"] and doc["dry"] is False
    assert verdict(results) == (1, "gpu-check: 2 ok, 0 skipped, 0 failed, 1 over budget; failed: slow (over budget)")


def test_failed_and_skipped_parts_say_why_and_a_cuda_only_part_is_skipped_by_name_in_a_dry_run(
    tmp_path: Path,
) -> None:
    broken = _py("print('FAILED: loss 3.1 vs 2.9'); raise SystemExit(1)")
    elsewhere = _py("print('skipped: x'); exit(3)")
    parts = [
        Part("broken", "correctness", "fails", 30, broken, broken),
        Part("elsewhere", "correctness", "cannot run here", 30, elsewhere, elsewhere),
        Part("cuda-only", "speed", "no dry form", 30, _py("raise SystemExit(1)"), None),
        Part("fine", "speed", "works", 30, _py("print('x'); print('ok: 2.0x')"), _py("print('ok: dry 1.0x')")),
    ]
    results, md = run_all(parts, dry=True, out=tmp_path)
    got = {r.name: (r.status, r.reason) for r in results}
    assert got == {
        "broken": ("failed", "exit 1: FAILED: loss 3.1 vs 2.9"),
        "elsewhere": ("skipped", "skipped: x"),
        "cuda-only": ("skipped", "needs CUDA (no --dry form)"),
        "fine": ("ok", "ok: dry 1.0x"),
    }
    assert md.name.endswith("-dry.md") and verdict(results)[0] == 1
    assert verdict(results[1:]) == (0, "gpu-check: 1 ok, 2 skipped, 0 failed, 0 over budget")


def test_a_pytest_part_is_skipped_when_its_tests_all_skip_and_fails_naming_its_test(tmp_path: Path) -> None:
    """The correctness parts run pytest: a test that skips (no CUDA) makes a skipped part, a
    failing one's line names the test and why, and ``dry_env`` reaches only the --dry run."""
    (tmp_path / "test_x.py").write_text(
        "import os, pytest\n"
        "def test_skips():\n    pytest.skip('needs a CUDA device')\n"
        "def test_fails():\n    pytest.fail('loss 3.1 vs 2.9')\n"
        "def test_env():\n    print('ok: env', os.environ.get('ONLY_DRY'))\n"
    )
    run = [PY, "-m", "pytest", "-q", "-s", "-rfEs", "-p", "no:cacheprovider", "-o", "addopts=", f"--rootdir={tmp_path}"]
    tests = tmp_path / "test_x.py"
    parts = [Part(n, "correctness", n, 60, [*run, f"{tests}::test_{n}"], env=WIDE) for n in ("skips", "fails", "env")]
    parts[2].dry_argv, parts[2].dry_env = parts[2].argv, {"ONLY_DRY": "1"}
    results, _ = run_all(parts, dry=False, out=tmp_path / "report")
    (skips, skip_reason), (fails, fail_reason), (env, env_reason) = [(r.status, r.reason) for r in results]
    assert skips == "skipped" and skip_reason.startswith("SKIPPED") and skip_reason.endswith(": needs a CUDA device")
    assert fails == "failed" and fail_reason.startswith("exit 1: FAILED ")
    assert fail_reason.endswith("test_x.py::test_fails - Failed: loss 3.1 vs 2.9")
    assert (env, env_reason) == ("ok", "ok: env None")
    (dry,), _ = run_all(parts[2:], dry=True, out=tmp_path / "dry")
    assert (dry.status, dry.reason) == ("ok", "ok: env 1")


def test_only_a_pytest_summary_of_skipped_tests_counts_as_skipped() -> None:
    assert only_skipped("s\nSKIPPED [1] t.py:3: needs a CUDA device\n1 skipped, 1 deselected in 0.52s\n")
    assert only_skipped("========== 2 skipped, 1 warning in 65.10s (0:01:05) ==========")
    assert not only_skipped("1 passed, 1 skipped in 2.00s")
    assert not only_skipped("ok: 1.2x\n")  # not pytest: the script's own statuses
    assert not only_skipped("")


def test_the_parts_fit_ten_minutes_on_a_gpu_and_every_speed_part_has_a_dry_form_or_needs_cuda() -> None:
    assert sum(p.budget_s for p in PARTS) <= 600  # 8 minutes, and resnet50-tta's 100 s
    assert len({p.name for p in PARTS}) == len(PARTS)
    assert [p.section for p in PARTS] == sorted((p.section for p in PARTS), key=["doctor", "correctness", "speed",
                                                                                 "whole"].index)  # fmt: skip
    cuda_only = {p.name for p in PARTS if p.dry_argv is None}
    assert cuda_only == {"cuda-tests", "kernels", "nvjpeg"}


# The dry run a part at a time (--only), each a test of its own: its ~4 minutes on 2 cores are
# shared by the xdist workers instead of ending one worker's queue.
@pytest.mark.slow
@pytest.mark.parametrize("part", [pytest.param(p, id=p.name) for p in PARTS])
def test_the_dry_run_runs_every_part_on_the_cpu_and_writes_its_report(tmp_path: Path, part: Part) -> None:
    env = {**os.environ, "PYTHON": PY}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry", "--out", str(tmp_path), "--only", part.name],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    (md,) = tmp_path.glob("*-dry.md")
    doc = json.loads(md.with_suffix(".json").read_text())
    ((name, status),) = [(r["name"], r["status"]) for r in doc["results"]]
    cuda_only = part.dry_argv is None
    assert (name, status) == (part.name, "skipped" if cuda_only else "ok"), doc["results"][0]["output"][-3000:]
    counts = f"{int(not cuda_only)} ok, {int(cuda_only)} skipped, 0 failed, 0 over budget"
    assert done.stdout.splitlines()[-1] == f"gpu-check: {counts}"
