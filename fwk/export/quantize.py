"""Stage 4: quantize the optimized fp32 ONNX model with onnxruntime's tools.

- ``int8``: static quantization in QDQ format, with QuantizeLinear/DequantizeLinear pairs
  around each quantized op, which onnxruntime fuses into integer kernels. The weights are
  int8, symmetric per output channel, and the activations int8 per tensor, their ranges
  calibrated by min/max on training batches. The model is first run through ORT's
  pre-processing (symbolic shape inference and a light optimization), which the quantizer
  needs to see every tensor's shape. For convolutional models.
- ``dynamic_int8``: int8 weights. Each activation's range is computed at run time, so there
  is no calibration. For transformers, which are MatMul-heavy and whose activations vary
  per input.
- ``fp16``: weights and compute in float16, the model's input and output kept float32.

Quantization is done on a copy. The fp32 file is never modified.
"""

from __future__ import annotations

import platform
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from fwk.export.to_onnx import INPUT


@dataclass
class Quantized:
    path: Path
    method: str
    nodes: int
    notes: list[str] = field(default_factory=list)


class _Batches(CalibrationDataReader):
    """Calibration inputs for onnxruntime: each numpy batch once, as {input name: batch}."""

    def __init__(self, batches: Iterable[np.ndarray]) -> None:
        self._it: Iterator[np.ndarray] = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._it, None)
        return None if batch is None else {INPUT: batch}


def _pre_process(src: Path, dst: Path, notes: list[str]) -> Path:
    from onnxruntime.quantization import quant_pre_process

    try:
        quant_pre_process(str(src), str(dst))
        return dst
    except Exception as exc:  # symbolic shape inference does not know every op: ONNX's own is enough
        notes.append(f"symbolic shape inference skipped ({type(exc).__name__})")
        quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)
        return dst


def reduce_range(choice: str, cpu: dict[str, bool | str]) -> tuple[bool, str]:
    """Decide whether to use 7-bit weights, and say why.

    ``auto`` turns them on for x86 CPUs without VNNI or AMX. There onnxruntime multiplies u8
    activations by s8 weights with VPMADDUBSW, which adds two products into an int16 and
    saturates. Weights in [-64, 63] cannot overflow it. On such a CPU a random conv net's int8
    outputs were 14% off (relative L2) with 8-bit weights and 2% with 7-bit ones
    (tests/export/test_quantize.py).
    """
    if choice != "auto":
        return choice == "true", f"export.reduce_range={choice}"
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    if x86 and not (cpu.get("vnni") or cpu.get("amx")):
        return True, f"reduce_range=auto chose 7-bit weights: this x86 CPU ({cpu.get('capability')}) has no VNNI"
    return False, "reduce_range=auto chose 8-bit weights: int8 dot products here do not saturate"


def static_int8(
    src: Path,
    dst: Path,
    calibration: Iterable[np.ndarray],
    per_channel: bool,
    reduce: bool,
    ranges: dict[str, list[dict[str, np.ndarray]]] | None = None,
) -> Quantized:
    """Quantize to static QDQ int8. ``ranges``, ORT TensorQuantOverrides such as QAT's learned
    ones, replace the calibrated ranges."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    notes: list[str] = []
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        pre = _pre_process(src, Path(tmp) / "preprocessed.onnx", notes)
        quantize_static(
            str(pre),
            str(dst),
            calibration_data_reader=_Batches(calibration),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            reduce_range=reduce,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={
                "ActivationSymmetric": False,
                "WeightSymmetric": True,
                **({"TensorQuantOverrides": ranges} if ranges else {}),
            },
        )
    return _done(dst, "int8", notes)


def dynamic_int8(src: Path, dst: Path, per_channel: bool, reduce: bool) -> Quantized:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    notes: list[str] = []
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        pre = _pre_process(src, Path(tmp) / "preprocessed.onnx", notes)
        quantize_dynamic(str(pre), str(dst), per_channel=per_channel, reduce_range=reduce, weight_type=QuantType.QInt8)
    return _done(dst, "dynamic_int8", notes)


def fp16(src: Path, dst: Path) -> Quantized:
    import onnx
    import onnx_ir
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx_ir.from_proto(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True))
    model.graph.sort()  # the converter appends the input's Cast last; ONNX wants nodes in topological order
    onnx.save(onnx_ir.to_proto(model), str(dst))
    return _done(dst, "fp16", [])


def _done(path: Path, method: str, notes: list[str]) -> Quantized:
    import onnx

    onnx.checker.check_model(str(path))
    return Quantized(path=path, method=method, nodes=len(onnx.load(str(path)).graph.node), notes=notes)
