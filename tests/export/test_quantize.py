"""Quantization of small exported models: static int8 (QDQ, per channel), dynamic int8, fp16."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from fwk.export import quantize
from fwk.export.optimize import optimize
from fwk.export.to_onnx import export_onnx


def _export(model: nn.Module, example: torch.Tensor, tmp: Path, task: str = "classification") -> Path:
    export_onnx(model.eval(), example, task, tmp / "raw.onnx", tmp / "log")
    info = optimize(tmp / "raw.onnx", tmp / "fp32.onnx")
    assert info.nodes_after <= info.nodes_before
    return info.path


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


def _weight_bytes(path: Path) -> int:
    """Bytes of all initializers: the weights, whatever their type (the file adds graph structure)."""
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in onnx.load(str(path)).graph.initializer)


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    """Relative L2 error: a random net's outputs are small sums of large terms, so compare norms."""
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


@pytest.fixture
def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
        nn.Linear(16 * 8 * 8, 10),
    )  # fmt: skip


def test_static_int8_is_qdq_per_channel_and_close(conv_net: nn.Module, tmp_path: Path) -> None:
    fp32 = _export(conv_net, torch.randn(2, 1, 8, 8), tmp_path)
    calib = [np.random.default_rng(i).standard_normal((16, 1, 8, 8)).astype(np.float32) for i in range(3)]
    q = quantize.static_int8(fp32, tmp_path / "int8.onnx", calib, per_channel=True, reduce=True)
    model = onnx.load(str(q.path))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 2 and "QuantizeLinear" in ops and "DequantizeLinear" in ops
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = [inits[n.input[0]] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert any(w.dtype == np.int8 and w.shape == (16, 1, 3, 3) for w in weights)
    dq_scales = [inits[n.input[1]] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert any(s.shape == (16,) for s in dq_scales)  # one scale per output channel
    x = calib[0]
    ref, out = _run(fp32, x), _run(q.path, x)
    # calibrated on these very inputs; 7-bit weights and 8-bit activations: ~2% measured
    assert _rel(out, ref) <= 0.06
    assert _weight_bytes(fp32) > 3.5 * _weight_bytes(q.path)  # 1 byte per weight instead of 4, plus scales
    assert not list(tmp_path.glob("*preprocessed*"))  # the pre-processed copy was temporary


def test_per_tensor_when_asked(conv_net: nn.Module, tmp_path: Path) -> None:
    fp32 = _export(conv_net, torch.randn(2, 1, 8, 8), tmp_path)
    calib = [np.ones((4, 1, 8, 8), np.float32)]
    q = quantize.static_int8(fp32, tmp_path / "int8.onnx", calib, per_channel=False, reduce=True)
    model = onnx.load(str(q.path))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    scales = [inits[n.input[1]] for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert all(s.size == 1 for s in scales)


def test_dynamic_int8_quantizes_matmuls(tmp_path: Path) -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 256, bias=False), nn.GELU(), nn.Linear(256, 64, bias=False))
    fp32 = _export(mlp, torch.randn(2, 64), tmp_path)
    q = quantize.dynamic_int8(fp32, tmp_path / "dynamic_int8.onnx", per_channel=True, reduce=True)
    ops = {n.op_type for n in onnx.load(str(q.path)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    ref, out = _run(fp32, x), _run(q.path, x)
    assert _rel(out, ref) <= 0.06  # 7-bit weights, 8-bit activations with this batch's range: ~2% measured
    assert _weight_bytes(fp32) > 3.5 * _weight_bytes(q.path)


def test_fp16_keeps_float32_inputs_and_outputs(conv_net: nn.Module, tmp_path: Path) -> None:
    fp32 = _export(conv_net, torch.randn(2, 1, 8, 8), tmp_path)
    q = quantize.fp16(fp32, tmp_path / "fp16.onnx")
    model = onnx.load(str(q.path))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    x = np.random.default_rng(1).standard_normal((3, 1, 8, 8)).astype(np.float32)
    ref, out = _run(fp32, x), _run(q.path, x)
    # fp16 keeps 11 significant bits: ~5e-4 relative per op, ~4e-4 measured here
    assert _rel(out, ref) <= 5e-3
    assert _weight_bytes(fp32) > 1.9 * _weight_bytes(q.path)


def test_reduce_range_auto_follows_the_cpu() -> None:
    on, why = quantize.reduce_range("auto", {"capability": "AVX2", "vnni": False, "amx": False})
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    assert on is x86 and (not x86 or "has no VNNI" in why)
    assert quantize.reduce_range("auto", {"capability": "AVX512", "vnni": True, "amx": False})[0] is False
    assert quantize.reduce_range("false", {"vnni": False})[0] is False
    assert quantize.reduce_range("true", {"vnni": True})[0] is True


def test_8_bit_weights_saturate_without_vnni(conv_net: nn.Module, tmp_path: Path) -> None:
    """Why reduce_range=auto exists: on an x86 CPU without VNNI, 8-bit weights overflow int16 sums."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if not x86 or torch.cpu._is_vnni_supported():
        pytest.skip("the saturation happens only on x86 CPUs without VNNI")
    fp32 = _export(conv_net, torch.randn(2, 1, 8, 8), tmp_path)
    calib = [np.random.default_rng(i).standard_normal((16, 1, 8, 8)).astype(np.float32) for i in range(3)]
    eight = quantize.static_int8(fp32, tmp_path / "8.onnx", calib, per_channel=True, reduce=False)
    seven = quantize.static_int8(fp32, tmp_path / "7.onnx", calib, per_channel=True, reduce=True)
    ref = _run(fp32, calib[0])
    assert _rel(_run(eight.path, calib[0]), ref) > 3 * _rel(_run(seven.path, calib[0]), ref)  # 14% vs 2% measured
