"""Quantization-aware training: the fake-quant scheme is ORT's, its ranges reach ORT, and QAT wins back accuracy."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from fwk.export import qat, quantize
from fwk.export.optimize import optimize
from fwk.export.to_onnx import export_onnx
from tests.export.conftest import QUICK, copy_run


def _conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 13, 3, padding=1), nn.ReLU(), nn.Conv2d(13, 7, 3), nn.ReLU(),  # 7x7 -> 7x7 -> 5x5
        nn.Flatten(), nn.Linear(7 * 5 * 5, 11),
    ).eval()  # fmt: skip


def _calib() -> list[np.ndarray]:
    return [np.random.default_rng(i).standard_normal((6, 3, 7, 7)).astype(np.float32) * (i + 1) for i in range(3)]


def _int8(net: nn.Module, tmp: Path, per_channel: bool, reduce: bool, ranges=None) -> onnx.ModelProto:
    if not (tmp / "fp32.onnx").exists():
        export_onnx(net, torch.randn(2, 3, 7, 7), "classification", tmp / "raw.onnx", tmp / "log")
        optimize(tmp / "raw.onnx", tmp / "fp32.onnx")
    q = quantize.static_int8(tmp / "fp32.onnx", tmp / "int8.onnx", _calib(), per_channel, reduce, ranges)
    return onnx.load(str(q.path))


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("per_channel,reduce", [(True, True), (True, False), (False, True)])
def test_scales_are_the_ones_ort_computes(tmp_path: Path, per_channel: bool, reduce: bool) -> None:
    """Weights (per channel, 7 or 8 bits) and activations (calibrated min/max): our formula, ORT's numbers."""
    net = _conv_net()
    inits = _inits(_int8(net, tmp_path, per_channel, reduce))
    for name in ("0", "2", "5"):
        w = dict(net.named_parameters())[f"{name}.weight"]
        ours = qat.weight_scales(w, per_channel, reduce).numpy()
        theirs = inits[f"{name}.weight_scale"].reshape(-1)
        np.testing.assert_array_equal(ours, theirs)  # same float64 arithmetic, then float32: bit-equal
        assert not inits[f"{name}.weight_zero_point"].any()  # symmetric
        q = inits[f"{name}.weight_quantized"]
        assert np.abs(q).max() == (64 if reduce else 127)  # the largest weight of a channel maps to qmax

    prepared = qat.prepare(net, per_channel, reduce, momentum=0.01)
    qat.calibrate(prepared, [torch.from_numpy(x) for x in _calib()])
    learned = qat.to_float(prepared)
    for module, tensor in (("0", "input"), ("5", "view")):  # the input of the first Conv and of the Linear
        scale, zp = qat.act_scale_zp(*map(torch.tensor, learned.inputs[module]))
        zp_name = "relu_1_zero_point" if tensor == "view" else f"{tensor}_zero_point"  # Reshape keeps its input's
        assert scale.item() == pytest.approx(inits[zp_name.replace("zero_point", "scale")].item(), rel=1e-6)
        assert zp.item() == inits[zp_name].item()


def test_straight_through_inside_the_range_zero_outside() -> None:
    r = qat.ActRange(momentum=0.1).eval()
    r.lo.fill_(-1.0), r.hi.fill_(2.0), r.seen.fill_(True)
    x = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.3, 1.99, 2.5, 10.0], requires_grad=True)
    y = r(x)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 1, 1, 1, 1, 1, 0, 0])
    scale = 3.0 / 255
    assert torch.all((y - x).abs()[1:6] <= scale / 2 + 1e-6)  # inside: rounded to the grid
    assert y[0].item() == pytest.approx(-1.0, abs=scale) and y[-1].item() == pytest.approx(2.0, abs=scale)  # clipped

    w = torch.randn(5, 4, 3, 3, requires_grad=True)
    fq = qat.fake_quant_weight(w, per_channel=True, reduce=True)
    fq.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))  # the scale comes from max|w|: no weight is clipped
    step = (w.detach().abs().amax(dim=(1, 2, 3)) / 64).reshape(-1, 1, 1, 1)
    assert torch.all((fq - w).abs() <= step / 2 + 1e-6)


def test_ranges_follow_training_batches_and_freeze_in_eval() -> None:
    r = qat.ActRange(momentum=0.25)
    r.lo.fill_(-1.0), r.hi.fill_(1.0), r.seen.fill_(True)
    r.train()
    r(torch.tensor([-5.0, 3.0]))
    assert (r.lo.item(), r.hi.item()) == (-2.0, 1.5)  # moved a quarter of the way to the batch's min/max
    r.eval()
    r(torch.tensor([-100.0, 100.0]))
    assert (r.lo.item(), r.hi.item()) == (-2.0, 1.5)


def test_learned_ranges_reach_the_int8_model(tmp_path: Path) -> None:
    """The overrides replace ORT's calibrated ranges, tensor by tensor, and nothing else."""
    net = _conv_net()
    ptq = _inits(_int8(net, tmp_path, True, True))
    prepared = qat.prepare(net, True, True, momentum=0.01)
    qat.calibrate(prepared, [torch.from_numpy(x) for x in _calib()])
    learned = qat.to_float(prepared)
    same = _inits(_int8(net, tmp_path, True, True, qat.overrides(tmp_path / "fp32.onnx", learned, "logits")))
    for name in ("input_scale", "relu_scale", "logits_scale"):
        assert same[name].item() == pytest.approx(ptq[name].item(), rel=1e-6)  # calibrated alike: the same
    learned.inputs["2"] = (0.0, 0.5)  # the second conv's input, as if QAT had narrowed it
    moved = _inits(_int8(net, tmp_path, True, True, qat.overrides(tmp_path / "fp32.onnx", learned, "logits")))
    assert moved["relu_scale"].item() == pytest.approx(0.5 / 255, rel=1e-6) and moved["relu_zero_point"] == -128
    assert moved["input_scale"] == same["input_scale"]


def test_act_scale_of_an_all_zero_tensor_is_ones() -> None:
    """A dead ReLU's range is [0, 0]: ORT then uses scale 1, zero point 0 (no division by zero)."""
    scale, zp = qat.act_scale_zp(torch.tensor(0.0), torch.tensor(0.0))
    assert (scale.item(), zp.item()) == (1.0, 0)
    scale, zp = qat.act_scale_zp(torch.tensor(0.5), torch.tensor(2.55))  # the range always holds 0
    assert (scale.item(), zp.item()) == (pytest.approx(0.01), -128)


def test_qat_settings_are_checked_and_in_the_export_id(digits_run: Path) -> None:
    from fwk.errors import UserError
    from fwk.export.pipeline import export_id
    from fwk.export.settings import PrunePlan, check_qat_steps, load_settings
    from fwk.track.store import RunDir

    with pytest.raises(UserError, match=r"export.qat_frac=0.0 is not allowed: expected a number in \(0, 1\]"):
        load_settings(["export.qat_frac=0"])
    assert (check_qat_steps("auto", "int8"), check_qat_steps("25", "int8"), check_qat_steps("0", "fp16")) == (
        "auto",
        25,
        0,
    )
    run, cfg = RunDir(digits_run), load_settings([])
    ckpt = next((digits_run / "checkpoints").iterdir())
    ids = {export_id(run, ckpt, PrunePlan(), "int8", cfg, 1.0, steps) for steps in (0, 10, "auto")}
    assert len(ids) == 3


def test_decide_steps() -> None:
    assert qat.decide_steps(12, 0.0, 1.0, 100, 0.1)[0] == 12
    steps, why = qat.decide_steps("auto", 0.5, 1.0, 100, 0.1)
    assert steps == 0 and "no QAT" in why
    steps, why = qat.decide_steps("auto", 3.0, 1.0, 300, 0.1)
    assert steps == 30 and "PTQ int8 lost 3.00 > --max-accuracy-drop 1" in why


def test_auto_skips_qat_when_ptq_is_within_the_limit(
    digits_run: Path, tmp_path: Path, said: pytest.LogCaptureFixture
) -> None:
    from fwk.export.pipeline import run_export
    from fwk.export.settings import PrunePlan, load_settings
    from fwk.track.store import RunDir

    run = copy_run(digits_run, tmp_path / "runs")
    report = run_export(
        RunDir(run),
        PrunePlan(),
        "int8",
        load_settings(QUICK),
        1.0,
        None,
        False,
        lambda _: None,
        qat_steps="auto",
    )
    assert report["qat"]["steps"] == 0 and report["final"] == "int8.onnx"
    assert [s["stage"] for s in report["stages"]][-1] == "onnx int8"
    assert not (run / "exports" / report["export_id"] / "int8-qat.onnx").exists()
    assert any(line.startswith("qat: --qat-steps auto: PTQ int8 lost") and "no QAT" in line for line in said.messages)


def _with_outlier_channel(run: Path, factor: float) -> None:
    """Scale the first conv's channel 3 by ``factor`` and the second conv's input 3 by 1/factor.

    ReLU commutes with a positive factor, so the float model computes the same function
    (up to rounding); but channel 3 now dominates the per-tensor activation range and the
    per-tensor weight scale, so post-training int8 rounds every other channel coarsely.
    """
    (ckpt,) = (run / "checkpoints").iterdir()
    state = torch.load(ckpt / "state.pt", weights_only=True)
    w = state["model"]
    w["features.0.weight"][3] *= factor
    w["features.0.bias"][3] *= factor
    w["features.2.weight"][:, 3] /= factor
    torch.save(state, ckpt / "state.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["sha256"]["state.pt"] = hashlib.sha256((ckpt / "state.pt").read_bytes()).hexdigest()
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def test_qat_recovers_accuracy_that_ptq_lost(digits_run: Path, tmp_path: Path, said: pytest.LogCaptureFixture) -> None:
    """An outlier channel and per-tensor 7-bit weights: PTQ int8 loses ~3 points; QAT (auto) wins most back.

    In this process (the imports are paid once per session); measured: PTQ 95.33%, QAT 98.00%
    against torch fp32's 98.33%, QAT in ~1 s of training (30 steps)."""
    from fwk.export.pipeline import run_export
    from fwk.export.settings import PrunePlan, load_settings
    from fwk.track.store import RunDir

    run = copy_run(digits_run, tmp_path / "runs")
    _with_outlier_channel(run, 100.0)
    settings = [*QUICK, "export.per_channel=false", "export.reduce_range=true", "export.qat_frac=0.3"]
    report = run_export(
        RunDir(run),
        PrunePlan(),
        "int8",
        load_settings(settings),
        1.0,
        None,
        False,
        lambda _: None,
        qat_steps="auto",
    )
    stages = {s["stage"]: s for s in report["stages"]}
    ptq, q = stages["onnx int8"], stages["onnx int8 qat"]
    assert ptq["drop"] >= 2.0, ptq  # the setting really hurts PTQ (3.0 points measured)
    assert report["qat"]["steps"] == 30 and "PTQ int8 lost" in report["qat"]["why"]
    gain = (q["val_acc"] - ptq["val_acc"]) * 100
    assert report["qat"]["gain"] == pytest.approx(gain)
    assert gain >= 0.5 * ptq["drop"]  # QAT wins back at least half of what PTQ lost (2.67 of 3.0 measured)
    # onnxruntime's int8 model computes what the fake-quantized torch model learned (integer
    # rounding of biases and requantization differ by one step here and there: 1 point allowed)
    assert abs(report["qat"]["torch_fake_quant_metric"] - q["val_acc"]) <= 0.01
    assert report["final"] == "int8-qat.onnx"
    assert report["stages"][-1]["stage"] == "onnx int8 qat" and ptq["superseded"]
    assert report["verdict"]["passed"]  # PTQ's drop beyond the limit no longer counts: it is not delivered
    export = run / "exports" / report["export_id"]
    assert (export / "int8-qat.onnx").is_file() and (export / "rounds" / "qat" / "summary.json").is_file()
    # the same int8 kernels as PTQ's model: the same graph, other weights and ranges
    ops = lambda name: sorted(n.op_type for n in onnx.load(str(export / name)).graph.node)  # noqa: E731
    assert ops("int8-qat.onnx") == ops("int8.onnx")
    assert any(line.startswith("qat: 30 steps, int8 PTQ") for line in said.messages)
