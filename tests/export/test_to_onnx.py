"""The ONNX stage: one checked file with a dynamic batch axis, and failures that name their cause."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from fwk.errors import UserError
from fwk.export.fold import fold
from fwk.export.to_onnx import export_onnx
from tests.conftest import run_fwk
from tests.export.conftest import copy_run
from tests.export.models import GatedCNN


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


class Svd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.spectrum = nn.Sequential(SvdValues())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.spectrum(self.proj(x))


class SvdValues(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.svdvals(x)  # no ONNX function for it


def test_folded_model_exports_with_a_dynamic_batch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ConvBN()
    model.body[1].running_mean.uniform_(-0.5, 0.5)  # statistics worth folding
    model.body[1].running_var.uniform_(0.5, 1.5)
    model.eval()
    folded = fold(model)
    assert (folded.norms_before, folded.norms_after) == (1, 0)
    path = tmp_path / "m.onnx"
    info = export_onnx(folded.model, torch.randn(2, 1, 6, 6), "classification", path, tmp_path / "log")
    assert info.dynamic_axes == ["batch"] and not info.external_data
    assert {p.name for p in tmp_path.iterdir()} == {"m.onnx", "log"}  # one file: no external-data sidecar
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert [i.name for i in proto.graph.input] == ["input"] and [o.name for o in proto.graph.output] == ["logits"]
    assert "BatchNormalization" not in {n.op_type for n in proto.graph.node}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 5):  # neither is the example's batch of 2
        x = torch.randn(batch, 1, 6, 6)
        with torch.no_grad():
            ref = model(x).numpy()
        out = session.run(None, {"input": x.numpy()})[0]
        # fp32 both ways; the folded conv sums in another order: ~1e-6 relative
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_missing_operator_names_the_op_and_module(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        export_onnx(Svd().eval(), torch.randn(2, 6, 6), "classification", tmp_path / "m.onnx", tmp_path / "log")
    message = str(err.value)
    assert message.startswith("cannot export the model to ONNX: operator aten._linalg_svd has no ONNX function")
    assert "(called in module spectrum.0 (SvdValues))" in message and "\n" not in message
    assert "Traceback" in (tmp_path / "log").read_text()  # the details are in the log, not on screen


def test_value_dependent_branch_names_module_and_line(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        model = GatedCNN(in_channels=1, channels1=4, channels2=4, hidden=8, num_classes=10).eval()
        export_onnx(model, torch.randn(2, 1, 8, 8), "classification", tmp_path / "m", tmp_path / "log")
    assert "torch.export failed in module gate (ValueGate) at models.py:" in str(err.value)
    assert "`if x.sum() > 0:" in str(err.value) and "torch.where or torch.cond" in str(err.value)


def test_fwk_export_of_a_model_that_cannot_be_exported(digits_run: Path, tmp_path: Path) -> None:
    """A run whose model trains fine and fails to export: one line, exit 2, no export dir left behind.

    The digits run, with its model section pointing at GatedCNN: the same weights load into
    it (it is small_cnn plus a parameter-free gate), without training it again."""
    runs = tmp_path / "runs"
    run = copy_run(digits_run, runs)
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(
        config.replace("  name: small_cnn\n", "  _target_: tests.export.models.GatedCNN\n", 1)
    )
    out = run_fwk("export", runs=runs)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    expected = "fwk: error: cannot export the model to ONNX: torch.export failed in module gate (ValueGate) at"
    assert line.startswith(expected)
    (log,) = (run / "exports").iterdir()  # the temp dir is gone, no export appears; the log stays
    assert log.name.endswith(".export.log") and line.endswith(f"(full log: {log})")
    assert "GuardOnDataDependentSymNode" in log.read_text()
