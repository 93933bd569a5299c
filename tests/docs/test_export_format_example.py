"""The worked example of a format of your own (docs/examples/export_format.py), run as a user
runs it: copied into a folder on PYTHONPATH, then ``fwk export --format npz`` in a fresh interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_fwk

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "export_format.py"


def export(runs: Path, plugins: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``fwk export ARGS`` in a fresh interpreter with ``plugins`` first on PYTHONPATH."""
    path = os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "FWK_RUNS": str(runs), "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "fwk", "export", *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_a_format_of_your_own_writes_the_checkpoints_weights(tmp_path: Path) -> None:
    from fwk.export.source import load
    from fwk.track.lookup import find_run

    runs = tmp_path / "runs"
    trained = run_fwk("train", "train.max_steps=4", "train.eval_every=0", "jit=off", runs=runs)
    assert trained.returncode == 0, trained.stderr[-3000:]
    plugins = tmp_path / "plugins"
    missing = export(runs, plugins, "--format", "npz")
    assert missing.returncode != 0
    known = "onnx, aoti, hf, pt2, pte, safetensors, tensorrt"
    assert missing.stderr.strip().splitlines()[-1].endswith(f"--format npz is not one of {known}")

    (plugins / "fwk" / "export" / "formats").mkdir(parents=True)
    shutil.copyfile(EXAMPLE, plugins / "fwk" / "export" / "formats" / "npz.py")
    target = tmp_path / "model.npz"
    out = export(runs, plugins, "--format", "npz", "--output", str(target))
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    state = load(find_run(runs, None)).model.state_dict()
    with np.load(target) as saved:
        assert sorted(saved.files) == sorted(state)
        for name, tensor in state.items():
            np.testing.assert_array_equal(saved[name], tensor.detach().cpu().numpy())
