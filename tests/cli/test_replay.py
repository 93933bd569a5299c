"""`fwk replay` end to end: a digits run replays identically; lineage; what it refuses."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.cli.test_fast_paths import probe
from tests.conftest import run_fwk

TINY = ["train.max_steps=6", "train.log_every=2", "train.eval_every=3", "jit=off", "train.deterministic=true"]


def _dirs(runs: Path) -> list[str]:
    return sorted(p.name for p in runs.glob("*/") if (p / "config.yaml").is_file())


def _edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_replay_of_a_digits_run_is_identical_and_linked(runs: Path) -> None:
    out = run_fwk("train", *TINY, runs=runs)
    assert out.returncode == 0, out.stderr
    [orig] = _dirs(runs)
    env = json.loads((runs / orig / "env.json").read_text())["launches"][0]
    assert env["machine"]["deterministic_algorithms"] is True and env["machine"]["cpu_count"] >= 1
    assert env["data"]["train"] == "TensorDataset, 1,497 items" and env["versions"]["torch"]
    meta = json.loads((runs / orig / "meta.json").read_text())
    assert meta["launches"][0]["overrides"] == TINY and len(meta["data"]["digest"]) == 16

    out = run_fwk("replay", orig[:6], runs=runs)
    assert out.returncode == 0, out.stderr
    [replay] = [d for d in _dirs(runs) if d != orig]
    assert f"replay {replay} of run {orig}: identical: 10 values in 5 rows are equal" in out.stdout
    replay_meta = json.loads((runs / replay / "meta.json").read_text())
    assert (replay_meta["parent"], replay_meta["kind"]) == (orig, "replay")
    rows = {r["id"]: r for r in json.loads(run_fwk("runs", "--json", runs=runs).stdout)}
    assert rows[replay]["parent"] == orig and rows[orig]["parent"] is None
    shown = run_fwk("runs", "show", replay, runs=runs).stdout
    assert f"{orig} -> {replay} (replay)" in shown
    assert f"{replay} (replay, complete)" in run_fwk("runs", "show", orig, runs=runs).stdout

    # again: the replay is found (content-addressed) and compared, nothing trains, no torch
    out, loaded = probe("replay", orig, "--json", runs=runs)
    assert out.returncode == 0 and "already complete" in out.stderr and loaded == []
    verdict = json.loads(out.stdout)
    assert (verdict["verdict"], verdict["rows"], verdict["differing"]) == ("identical", 5, 0)
    assert _dirs(runs) == sorted([orig, replay])

    # a difference within the tolerance, then beyond it
    metrics = runs / orig / "metrics.jsonl"
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    loss = lines[0]["loss"]
    lines[0]["loss"] = loss * (1 + 1e-6)
    metrics.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = run_fwk("replay", orig, runs=runs)
    assert out.returncode == 0 and "within tolerance: 1 of 10 values differ" in out.stdout, out.stdout
    out = run_fwk("replay", orig, "--tolerance", "1e-7", runs=runs)
    assert out.returncode == 1 and "differs: 1 of 10 values differ" in out.stdout
    assert f"largest difference: loss at train step 2: {lines[0]['loss']!r} vs {loss!r}" in out.stdout


def test_replay_refuses_other_code_or_data_in_one_line(runs: Path) -> None:
    out = run_fwk("train", *TINY[:1], "train.eval_every=0", "jit=off", runs=runs)
    assert out.returncode == 0, out.stderr
    [orig] = _dirs(runs)
    meta = runs / orig / "meta.json"
    real = json.loads(meta.read_text())
    _edit_json(meta, code="git:0123456789ab")
    out = run_fwk("replay", orig, runs=runs)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "trained on code git:0123456789ab" in out.stderr and "--force" in out.stderr
    _edit_json(meta, code=real["code"], data={"digest": "0000000000000000", "what": "older digits"})
    out = run_fwk("replay", orig, runs=runs)
    assert out.returncode == 2 and "data changed since it was trained: recorded 0000000000000000" in out.stderr
    assert _dirs(runs) == [orig]  # nothing was created
    out = run_fwk("replay", "zzz", runs=runs)
    assert out.returncode == 2 and f"closest ids: {orig}" in out.stderr


def test_a_replay_re_applies_the_measured_decisions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The original timed bf16 against fp32 on a CPU with bf16 units, then redid those steps
    as decided; the replay, on one without (and so with nothing to time), follows the choice
    from step 0 without trial steps and matches exactly. --redecide decides afresh."""
    runs = tmp_path / "runs"
    steps = ["train.max_steps=30", "train.log_every=5", "train.eval_every=15", "precision.max_trial_share=1"]
    monkeypatch.setenv("FWK_CPU_BF16", "1")
    out = run_fwk("train", *steps, runs=runs)
    assert out.returncode == 0 and "timing bf16 against fp32 on steps 0-7" in out.stdout, out.stdout + out.stderr
    [orig] = _dirs(runs)
    choice = json.loads((runs / orig / "summary.json").read_text())["decisions"]["precision"]["choice"]

    monkeypatch.setenv("FWK_CPU_BF16", "0")
    out = run_fwk("replay", orig, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"re-applying run {orig}'s decisions: precision {choice}" in out.stderr
    assert f"precision=auto re-applies {choice}, as the replayed run decided (--redecide" in out.stderr
    assert "timing" not in out.stderr and "trial steps" not in out.stderr
    assert "identical: 16 values in 8 rows are equal" in out.stdout, out.stdout
    assert "precision=auto" not in out.stdout  # the run's lines on stderr: stdout holds the verdict alone

    [replay] = [d for d in _dirs(runs) if d != orig]
    shutil.rmtree(runs / replay)  # so that it trains again, deciding afresh on this CPU: fp32, untimed
    out = run_fwk("replay", orig, "--redecide", runs=runs)
    assert f"deciding afresh (--redecide), not re-applying run {orig}'s decisions" in out.stderr
    assert "precision=auto chose fp32: CPU" in out.stderr and f"replay {replay} of run {orig}:" in out.stdout


def _on_terminals(args: list[str], runs: Path) -> tuple[int, str, str]:
    """``fwk ARGS`` with stdout and stderr each on a terminal of its own, as a user at one sees
    it: where a progress bar draws. Its exit status and what each terminal got."""
    root = str(Path(__file__).parents[2])
    env = {**os.environ, "FWK_RUNS": str(runs), "COLUMNS": "120", "TERM": "xterm"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    (out_master, out_slave), (err_master, err_slave) = pty.openpty(), pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fwk", *args], stdout=out_slave, stderr=err_slave, env=env)
    os.close(out_slave), os.close(err_slave)
    got: dict[int, list[bytes]] = {out_master: [], err_master: []}

    def drain(fd: int) -> None:  # until every process holding the terminal has closed it
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the other side is closed
                return
            if not chunk:
                return
            got[fd].append(chunk)

    readers = [threading.Thread(target=drain, args=(fd,), daemon=True) for fd in got]
    for reader in readers:
        reader.start()
    code = proc.wait(timeout=300)
    for reader in readers:
        reader.join(timeout=30)
    os.close(out_master), os.close(err_master)
    out, err = (b"".join(got[fd]).decode(errors="replace") for fd in (out_master, err_master))
    return code, out, err


@pytest.mark.parametrize("processes", [1, 2], ids=["in-process", "torchrun"])
def test_replay_json_on_a_terminal_is_the_verdict_alone(runs: Path, processes: int) -> None:
    """`fwk replay --json` prints JSON on stdout and nothing else: the progress bar (on a terminal)
    and the replayed run's lines, also those torchrun's rank 0 prints, are on stderr."""
    out = run_fwk("train", *TINY, f"parallel.nproc_per_node={processes}", runs=runs)
    assert out.returncode == 0, out.stderr
    [orig] = _dirs(runs)
    code, stdout, stderr = _on_terminals(["replay", orig, "--json"], runs)
    assert code == 0, stdout + stderr
    verdict = json.loads(stdout)  # a terminal ends lines with \r\n: whitespace to JSON
    assert (verdict["original"], verdict["verdict"]) == (orig, "identical")
    assert "\u2501" in stderr and "6/6" in stderr  # the bar, drawn on stderr's terminal
    # each line printed above the bar, through its console: the bar's row is cleared first
    assert "\r\x1b[2Kstep" in stderr.replace("\x1b[1;36m", "").replace("\x1b[0m", ""), repr(stderr)
