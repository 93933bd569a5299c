"""`fwk export --format tensorrt`: refused in one line on a machine without CUDA, before any
work; on a GPU (make gpu-check's tensorrt part), compiled, reloaded in a fresh process and
timed against the aoti export of the same run."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import run_fwk
from tests.export.conftest import copy_run


def test_tensorrt_on_a_machine_without_cuda_is_one_line_before_any_work(
    digits_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fwk.errors import UserError
    from fwk.export.formats.tensorrt import check_machine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the probe, mocked: any machine
    with pytest.raises(UserError, match=r"^--format tensorrt builds TensorRT engines for an NVIDIA GPU"):
        check_machine()
    if not torch.cuda.is_available():  # the real command, where this machine really has none
        runs = tmp_path / "runs"
        run = copy_run(digits_run, runs)
        out = run_fwk("export", "--format", "tensorrt", runs=runs)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.strip().splitlines() == [
            "fwk: error: --format tensorrt builds TensorRT engines for an NVIDIA GPU, and this machine has no CUDA "
            "device; export --format aoti or onnx for a CPU, or run this on the GPU machine that will serve it"
        ]
        assert not (run / "exports").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(importlib.util.find_spec("torch_tensorrt") is None, reason="needs the torch-tensorrt package")
def test_a_tensorrt_export_reloads_with_the_checkpoints_outputs_and_is_timed_against_aoti(
    digits_run: Path, tmp_path: Path
) -> None:
    from fwk.export.reload import loader
    from fwk.export.source import load
    from fwk.track.lookup import find_run

    runs = tmp_path / "runs"
    copy_run(digits_run, runs)
    for fmt in ("tensorrt", "aoti"):
        out = run_fwk("export", "--format", fmt, runs=runs)
        assert out.returncode == 0, out.stdout + out.stderr
    made = runs.glob("*/exports/*/weights_report.json")
    reports = {r["format"]: r for r in (json.loads(p.read_text()) for p in made)}
    assert reports["tensorrt"]["passed"] and reports["tensorrt"]["runtime"] == "tensorrt"
    source = load(find_run(runs, None))
    x = torch.stack([torch.as_tensor(source.data.val[i][0]) for i in range(32)])
    (export,) = [p.parent for p in runs.glob("*/exports/*/model.ep")]
    trt = loader("tensorrt", export / "model.ep")
    (aot,) = [p for p in runs.glob("*/exports/*/model.aoti.pt2")]
    aoti = loader("aoti", aot)  # compiled for the CPU it ran on
    with torch.no_grad():
        torch.testing.assert_close(trt(x), source.model(x), rtol=0, atol=1e-3)
        for rows in (1, 32):
            ms = {}
            for name, run in (("tensorrt", trt), ("aoti", aoti)):
                run(x[:rows])
                t0 = time.perf_counter()
                for _ in range(50):
                    run(x[:rows])
                ms[name] = (time.perf_counter() - t0) / 50 * 1e3
            print(f"ok: batch {rows}: tensorrt {ms['tensorrt']:.3f} ms, aoti (CPU) {ms['aoti']:.3f} ms")
