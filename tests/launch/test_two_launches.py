"""The same multi-node run launched twice: the second launch is refused on every machine.

Two 2-machine launches of one command on localhost, each with its own rendezvous (as two
sbatch submissions of one script get): the first trains, the second's launchers find the
first's fresh lease in the shared run dir and exit with one line naming it, and `fwk runs`
shows the run as running while the first trains, complete after."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import torch.distributed as dist

from tests import zygote
from tests.conftest import require, run_fwk

ARGS = [
    "train",
    "model.channels1=8",
    "model.channels2=16",
    "model.hidden=32",
    "train.max_steps=40",
    "train.eval_every=40",
    "train.log_every=10",
    "jit=off",
    "parallel.nnodes=2",
]


def _endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"parallel.rdzv_endpoint=127.0.0.1:{s.getsockname()[1]}"


def test_a_second_launch_of_a_multi_node_run_is_refused_on_every_machine(tmp_path: Path) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    runs = tmp_path / "runs"
    env = {**os.environ, "FWK_RUNS": str(runs), "PYTHONUNBUFFERED": "1"}
    first_job = _endpoint()
    first = [zygote.popen([*ARGS, first_job], env) for _ in range(2)]
    deadline = time.monotonic() + 120
    while not (list(runs.glob("*/lease.json")) and list(runs.glob("*/meta.json"))):  # held, and the run opened
        assert all(p.poll() is None for p in first) and time.monotonic() < deadline, first[0].communicate()
        time.sleep(0.01)
    (path,) = runs.glob("*/")

    second_job = _endpoint()
    second = [zygote.popen([*ARGS, second_job], env) for _ in range(2)]
    listed = run_fwk("runs", "--json", runs=runs)
    for proc in second:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and err.count("\n") == 1, out + err
        assert err.startswith(
            f"fwk: error: run {path.name} is already running as rendezvous {first_job.partition('=')[2]} (host "
        ), err
    assert all(p.poll() is None for p in first), "the first launch was stopped by the second"
    assert [r["status"] for r in json.loads(listed.stdout)] == ["running"]

    for proc in first:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out + err
    assert not (path / "lease.json").exists()  # its last launcher out removed it
    assert [r["status"] for r in json.loads(run_fwk("runs", "--json", runs=runs).stdout)] == ["complete"]
    assert json.loads((path / "summary.json").read_text())["world_size"] == 2
    launches = json.loads((path / "meta.json").read_text())["launches"]
    # the refused launches wrote nothing (the first job's two launchers may race on meta.json: 1 or 2 entries)
    assert launches and {x["overrides"][-1] for x in launches} == {first_job}
