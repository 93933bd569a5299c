"""`fwk export` end to end, through the real command: digits_cnn int8, gpt dynamic_int8, resnet_digits int8."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tests.conftest import run_fwk
from tests.export.conftest import QUICK, copy_run


def _export_dir(run: Path, prune: str | None = None) -> Path:
    """The run's one export (with ``prune``: the one pruned that way; without: the one not pruned)."""

    def method(p: Path) -> str | None:
        report = p / "export_report.json"
        return (json.loads(report.read_text()).get("prune") or {}).get("method") if report.is_file() else None

    (found,) = [p for p in (run / "exports").iterdir() if p.is_dir() and method(p) == prune]
    return found


def _weight_bytes(path: Path, op: str) -> int:
    """Bytes of the weight initializers that feed ``op`` nodes (directly, or through a DequantizeLinear)."""
    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    dq = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    total = 0
    for node in model.graph.node:
        if node.op_type == op:
            name = dq.get(node.input[1], node.input[1])
            total += len(onnx.numpy_helper.to_array(inits[name]).tobytes())
    return total


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_digits_int8_end_to_end(digits_run: Path, tmp_path: Path) -> None:
    from fwk.components.checkpoint import model_weights
    from fwk.data.digits import DigitsConfig, digits
    from fwk.models.cnn import SmallCNNConfig, small_cnn

    runs = tmp_path / "runs"
    run = copy_run(digits_run, runs)
    model_path = tmp_path / "model.onnx"
    out = run_fwk("export", run.name[:4], *QUICK, "--output", str(model_path), runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "passed: every stage's accuracy within 1 point of torch fp32" in out.stdout
    export = _export_dir(run)
    report = json.loads((export / "export_report.json").read_text())
    assert report["parent_run"] == run.name and report["final"] == "int8.onnx"
    assert model_path.read_bytes() == (export / "int8.onnx").read_bytes()

    # The model in a fresh onnxruntime session, against torch fp32 rebuilt from the checkpoint.
    model = small_cnn(SmallCNNConfig()).eval()
    (ckpt,) = (run / "checkpoints").iterdir()
    model.load_state_dict(model_weights(ckpt))
    x, y = digits(DigitsConfig(), seed=0).val.tensors
    with torch.no_grad():
        ref = model(x).numpy()
    int8 = _session(model_path).run(None, {"input": x.numpy()})[0]
    fp32 = _session(export / "fp32.onnx").run(None, {"input": x.numpy()})[0]
    scale = np.abs(ref).max()
    # fp32: the same math, summed in another order: ~1e-6 of the largest logit
    assert np.abs(fp32 - ref).max() <= 1e-4 * scale
    # int8: weights and activations rounded to 1/255 of their range; logits move by a few % of theirs
    assert np.abs(int8 - ref).max() <= 0.15 * scale
    assert (int8.argmax(1) == ref.argmax(1)).mean() >= 0.97

    # The report's figures are the ones measured here, and agree with each other.
    stages = {s["stage"]: s for s in report["stages"]}
    torch_acc = float((ref.argmax(1) == y.numpy()).mean())
    assert stages["torch fp32"]["val_acc"] == torch_acc
    summary = json.loads((run / "summary.json").read_text())
    assert abs(summary["eval"]["val_acc"] - torch_acc) <= 1 / 300  # the engine's own evaluation
    assert abs(stages["onnx int8"]["val_acc"] - float((int8.argmax(1) == y.numpy()).mean())) <= 1 / 300
    assert stages["onnx int8"]["drop"] == (stages["torch fp32"]["val_acc"] - stages["onnx int8"]["val_acc"]) * 100
    for name in ("fp32.onnx", "int8.onnx"):
        stage = next(s for s in report["stages"] if s["artifact"] == name)
        assert stage["size_bytes"] == (export / name).stat().st_size
    assert stages["torch fp32"]["weights"] == sum(p.numel() for p in model.parameters())
    assert stages["onnx fp32"]["rel_diff"] <= 1e-4 and stages["torch fp32"]["agreement"] == 1.0
    assert stages["onnx fp32"]["size_bytes"] > 2 * stages["onnx int8"]["size_bytes"]
    # int8 weights are 1 byte where fp32's are 4
    assert _weight_bytes(export / "fp32.onnx", "Conv") > 3.9 * _weight_bytes(export / "int8.onnx", "Conv")
    for stage in ("torch fp32", "onnx fp32", "onnx int8"):
        for batch in ("1", "8"):
            lat = stages[stage]["latency_ms"][batch]
            assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["max"]
    assert report["recommendation"]["artifact"] in ("fp32.onnx", "int8.onnx")
    assert report["cpu"]["capability"] and report["threads"] >= 1

    # The same command is the same export: shown again, not redone; --output refuses to overwrite.
    again = run_fwk("export", run.name, *QUICK, "--output", str(model_path), runs=runs)
    assert again.returncode == 2 and "already exists; pass --overwrite" in again.stderr
    again = run_fwk("export", run.name, *QUICK, "--output", str(model_path), "--overwrite", runs=runs)
    assert again.returncode == 0, again.stderr
    assert f"export {export.name} of run {run.name} already exists" in again.stdout
    assert json.loads((export / "export_report.json").read_text()) == report


def test_stage_that_fails_its_check_exits_1_and_keeps_artifacts(digits_run: Path, tmp_path: Path) -> None:
    """An fp32 ONNX model is never bit-equal to torch: a tolerance of 1e-12 fails it, by name.

    The export runs in this process (its imports are paid once per test session); the
    command is then checked on the stored export, which it shows again without redoing it."""
    from fwk.export.pipeline import VerificationFailed, run_export
    from fwk.export.settings import PrunePlan, load_settings
    from fwk.track.store import RunDir

    runs = tmp_path / "runs"
    run = copy_run(digits_run, runs)
    settings = ["export.fp32_rtol=1e-12", *QUICK]
    cfg = load_settings(settings)
    with pytest.raises(VerificationFailed):
        run_export(RunDir(run), PrunePlan(), "none", cfg, 1.0, None, False, show=lambda _: None)
    out = run_fwk("export", "--quantize", "none", *settings, "--output", str(tmp_path / "m.onnx"), runs=runs)
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("fwk: error: stage 'onnx fp32' differs from torch fp32")
    export = _export_dir(run)
    assert "artifacts kept in " + str(export) in line
    assert {p.name for p in export.iterdir()} >= {"fp32.onnx", "export_report.json"}
    assert json.loads((export / "export_report.json").read_text())["verdict"]["stage"] == "onnx fp32"
    assert not (tmp_path / "m.onnx").exists()  # a model that failed is not delivered


def test_gpt_dynamic_int8_with_dynamic_batch_and_sequence(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    tiny = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "data.max_bytes=20000"]
    train = ["data.val_max_bytes=4096", "train.batch_size=8", "train.max_steps=20", "train.eval_every=0", "jit=off"]
    out = run_fwk("train", "recipe=gpt_stdlib", *tiny, *train, runs=runs)
    assert out.returncode == 0, out.stderr
    out = run_fwk("export", "--quantize", "dynamic_int8", "--max-accuracy-drop", "5", *QUICK, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = runs.glob("*/")  # run dirs, not the index
    export = _export_dir(run)
    report = json.loads((export / "export_report.json").read_text())
    assert report["task"] == "lm" and report["metric"] == "val_loss"
    assert report["onnx"]["dynamic_axes"] == ["batch", "seq"]
    stages = {s["stage"]: s for s in report["stages"]}
    assert "val_acc" not in stages["torch fp32"] and stages["torch fp32"]["val_loss"] > 0
    assert abs(stages["onnx dynamic_int8"]["drop"]) <= 5
    assert stages["onnx fp32"]["size_bytes"] > 3 * stages["onnx dynamic_int8"]["size_bytes"]
    ops = {n.op_type for n in onnx.load(str(export / "dynamic_int8.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops

    # Another batch size and a shorter sequence than the export's example (2, 128).
    from fwk.export.source import load
    from fwk.track.store import RunDir

    source = load(RunDir(run))
    idx = torch.stack([source.data.val[i][0] for i in range(3)])[:, :17]  # (3, 17) bytes of real text
    with torch.no_grad():
        ref = source.model(idx).numpy()
    fp32 = _session(export / "fp32.onnx").run(None, {"input": idx.numpy()})[0]
    int8 = _session(export / "dynamic_int8.onnx").run(None, {"input": idx.numpy()})[0]
    assert fp32.shape == int8.shape == (3, 17, 256)
    assert np.abs(fp32 - ref).max() <= 1e-4 * np.abs(ref).max()  # fp32, summed in another order
    # int8: weights rounded to 1/255 of each channel's range, activations of each batch's; it adds
    # up over the layers to a few % of the logits' range
    assert np.abs(int8 - ref).max() <= 0.1 * (ref.max() - ref.min())
    assert (int8.argmax(-1) == ref.argmax(-1)).mean() >= 0.9

    # Whole heads pruned (2 -> 1), the residual width kept; the pruned model still exports.
    prune = ["--prune", "magnitude", "--ratio", "0.5", "--quantize", "none", "export.finetune_frac=0.1"]
    out = run_fwk("export", *prune, "--max-accuracy-drop", "100", *QUICK, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    pruned = _export_dir(run, prune="magnitude")
    report = json.loads((pruned / "export_report.json").read_text())
    stages = {s["stage"]: s for s in report["stages"]}
    assert stages["onnx fp32"]["rel_diff"] <= 1e-4 and report["prune"]["params_left"] < 0.9
    shapes = [list(t.dims) for t in onnx.load(str(pruned / "fp32.onnx")).graph.initializer]
    # qkv (32 -> 3 x one head of 16) and the attention's projection back (16 -> 32), transposed for MatMul
    assert [32, 48] in shapes and [16, 32] in shapes and [32, 96] not in shapes


def test_resnet_digits_folds_and_quantizes_per_channel(tmp_path: Path) -> None:
    """The recipe's ResNet-18 (BatchNorms, residuals) at 2 training steps: export mechanics, not accuracy.

    16 px instead of the recipe's 32: every stage still downsamples (16 -> 8 -> 4 -> 2), at a
    quarter of the convolutions' work in each forward pass the export runs."""
    runs = tmp_path / "runs"
    train = ["train.max_steps=2", "train.batch_size=8", "train.eval_every=0", "data.val_size=40", "jit=off"]
    train += ["data.image_size=16"]
    out = run_fwk("train", "recipe=resnet_digits", *train, runs=runs)
    assert out.returncode == 0, out.stderr
    quick = ["export.batch_size=20", "export.calib_batches=1", "export.latency_batch=4", "export.iterations=1"]
    out = run_fwk("export", "--max-accuracy-drop", "100", *quick, "export.warmup=0", runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = runs.glob("*/")  # run dirs, not the index
    export = _export_dir(run)
    report = json.loads((export / "export_report.json").read_text())
    assert report["folded_batchnorms"] == 20
    fp32, int8 = onnx.load(str(export / "fp32.onnx")), onnx.load(str(export / "int8.onnx"))
    assert not any(n.op_type == "BatchNormalization" for n in fp32.graph.node)
    assert sum(n.op_type == "Conv" for n in fp32.graph.node) == 20  # 17 3x3 + 3 downsample 1x1
    # per-channel: each conv weight has one scale per output channel
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in int8.graph.initializer}
    dq = {n.output[0]: n for n in int8.graph.node if n.op_type == "DequantizeLinear"}
    conv = next(n for n in int8.graph.node if n.op_type == "Conv")
    weight_dq = dq[conv.input[1]]
    assert inits[weight_dq.input[0]].dtype == np.int8
    assert inits[weight_dq.input[1]].shape == (inits[weight_dq.input[0]].shape[0],)
    stages = {s["stage"]: s for s in report["stages"]}
    assert stages["folded"]["rel_diff"] <= 1e-4 and stages["onnx fp32"]["rel_diff"] <= 1e-4
    assert stages["onnx fp32"]["size_bytes"] > 3.5 * stages["onnx int8"]["size_bytes"]
