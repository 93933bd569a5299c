"""A method is one file: the extending page's example (docs/examples/input_noise.py),
saved in a ``fwk/methods/`` folder on ``PYTHONPATH``, is found, configured, checked and run
by the real ``fwk train``, its workers included, with no change to fwk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "input_noise.py"


def _fwk(*args: str, plugins: Path | None, runs: Path) -> subprocess.CompletedProcess:
    """A fresh ``python -m fwk`` (the test zygote's fwk has listed fwk/methods already)."""
    env = {
        **os.environ,
        "FWK_RUNS": str(runs),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(plugins or ""), str(ROOT)])),
    }
    return subprocess.run([sys.executable, "-m", "fwk", *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def plugins(tmp_path: Path) -> Path:
    folder = tmp_path / "my_methods"
    (folder / "fwk" / "methods").mkdir(parents=True)
    (folder / "fwk" / "methods" / "input_noise.py").write_text(EXAMPLE.read_text())
    return folder


def test_the_example_method_trains_from_its_one_file(plugins: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    args = ["train", "methods=[input_noise]", "method.input_noise.std=0.05", "train.max_steps=6", "train.eval_every=6"]
    out = _fwk(*args, "jit=off", plugins=plugins, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "input_noise: std 0.05 on the inputs until step 3" in out.stdout
    (run,) = runs.glob("*/")
    config = (run / "config.yaml").read_text()
    assert "input_noise:\n    std: 0.05\n    until: 0.5\n" in config  # its settings joined the config


def test_its_own_rule_is_one_line_and_without_its_file_it_is_unknown(plugins: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    bad = _fwk("train", "methods=[input_noise]", "method.input_noise.std=-1", plugins=plugins, runs=runs)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "fwk: error: method.input_noise.std=-1.0 is not allowed: expected a number >= 0 "
        "(fix it with method.input_noise.std=...)"
    )
    absent = _fwk("train", "methods=[input_noise]", "--cfg", plugins=None, runs=runs)
    assert absent.returncode == 2 and "unknown key" not in absent.stderr
    assert "methods=['input_noise'] is not allowed: expected a list of early_exit, ema," in absent.stderr
    assert not runs.exists()


def test_cfg_reads_every_methods_settings_without_torch(plugins: Path) -> None:
    code = (
        "import sys; from fwk.config.schema import MethodConfig; "
        "print(sorted(vars(MethodConfig())), 'torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": f"{plugins}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == (
        "['early_exit', 'ema', 'input_noise', 'label_smoothing', 'progressive_resize', 'prune_gradually', "
        "'seq_warmup'] False"
    ), out.stderr
