"""Quantization-aware training: fine-tune the folded model through the int8 model's own rounding.

The scheme is the one ``quantize.static_int8`` gives onnxruntime, so the model trained
here is the model that runs:

- weights: symmetric int8 per output channel, or per tensor with ``per_channel=false``.
  The scale is max|w| / 127, or / 64 with ``reduce_range``, which gives 7-bit weights in
  [-64, 64]. It is recomputed from the weights at every step, as ORT computes it from the
  final ones.
- activations: the input of every Conv and Linear and the model's output, asymmetric
  int8 per tensor, scale = (max - min) / 255 over a range that always holds 0. The
  range starts at the calibration batches' min/max, which is PTQ's exact starting point.
  It follows each training batch's min/max as a moving average with factor ``momentum``,
  and it is frozen in eval mode.
- gradients: straight through, as ``torch.fake_quantize_*`` passes them: 1 inside the
  range, 0 where a value was clipped.

How the int8 model keeps the learned ranges: the trained float weights are exported to
fp32 ONNX as usual and quantized by the same ``quantize_static`` call as PTQ, with the
QAT ranges handed over as ``TensorQuantOverrides``. These are the rmin/rmax of the tensor
each Conv or Gemm reads, found by its weight's initializer name, which is the torch module
name, and of the output. Weights need no override: ORT computes their scales from the
trained weights with the formula used in training. The alternative, exporting the
fake-quant ops as QuantizeLinear/DequantizeLinear pairs, puts Q/DQ only where torch had
them. ORT's int8 kernels need a Q after each op too (its node units), so convs would run
in float behind a DQ. Through the quantizer the QAT model has the very graph layout of the
PTQ model: same int8 kernels, same latency. Only weights and ranges differ.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from fwk.config.export_schema import ExportConfig

logger = logging.getLogger(__name__)

ACT_QMIN, ACT_QMAX = -128, 127  # activations: QInt8, asymmetric (ORT's ONNX_INT_TYPE_RANGE)
_TINY = float(np.finfo(np.float32).tiny)  # below it ORT gives up on the range: scale 1, zero point 0


def weight_qrange(reduce: bool) -> tuple[int, int]:
    """Return ORT's symmetric int8 weight range: [-127, 127], or [-64, 64] with reduce_range."""
    return (-64, 64) if reduce else (-127, 127)


def weight_scales(w: torch.Tensor, per_channel: bool, reduce: bool) -> torch.Tensor:
    """Compute the scale of each output channel along axis 0, or one (1,) tensor per tensor, as
    ORT's compute_scale_zp does."""
    qmin, qmax = weight_qrange(reduce)
    flat = w.detach().reshape(w.shape[0], -1) if per_channel else w.detach().reshape(1, -1)
    absmax = flat.abs().amax(dim=1).double()  # float64, then float32: as ORT computes it
    scale = (2 * absmax / (qmax - qmin)).float()
    return torch.where(scale < _TINY, torch.ones_like(scale), scale)


def act_scale_zp(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the scale and zero point of an asymmetric int8 tensor whose values span [lo, hi],
    by ORT's formula."""
    lo64 = torch.clamp(lo.detach().double(), max=0.0)
    hi64 = torch.clamp(hi.detach().double(), min=0.0)
    scale = ((hi64 - lo64) / (ACT_QMAX - ACT_QMIN)).float()
    empty = scale < _TINY  # torch.where, not an `if`: no device-to-host sync per layer on a GPU
    zp = torch.where(empty, 0.0, torch.round(ACT_QMIN - lo64 / scale.double().clamp(min=_TINY)))
    return torch.where(empty, 1.0, scale).reshape(1), zp.to(torch.int32).reshape(1)


def fake_quant_weight(w: torch.Tensor, per_channel: bool, reduce: bool) -> torch.Tensor:
    qmin, qmax = weight_qrange(reduce)
    scale = weight_scales(w, per_channel, reduce).to(w.device)
    if not per_channel:
        return torch.fake_quantize_per_tensor_affine(w, scale, torch.zeros(1, dtype=torch.int32), qmin, qmax)
    zp = torch.zeros(w.shape[0], dtype=torch.int32, device=w.device)
    return torch.fake_quantize_per_channel_affine(w, scale, zp, 0, qmin, qmax)


class ActRange(nn.Module):
    """Per-tensor int8 fake quantization with an observed range. The range is a moving average
    in train mode and frozen in eval mode."""

    def __init__(self, momentum: float) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("lo", torch.zeros(()))
        self.register_buffer("hi", torch.zeros(()))
        self.register_buffer("seen", torch.zeros((), dtype=torch.bool))
        self.calibrating = False  # True: widen to the min/max of every batch (calibration), no rounding

    def observe(self, x: torch.Tensor) -> None:
        lo, hi = x.detach().min().float(), x.detach().max().float()
        if not bool(self.seen):
            self.lo.copy_(lo)
            self.hi.copy_(hi)
            self.seen.fill_(True)
        elif self.calibrating:
            self.lo.copy_(torch.minimum(self.lo, lo))
            self.hi.copy_(torch.maximum(self.hi, hi))
        else:
            self.lo.add_(self.momentum * (lo - self.lo))
            self.hi.add_(self.momentum * (hi - self.hi))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.calibrating or self.training:
            self.observe(x)
        if self.calibrating:
            return x
        scale, zp = act_scale_zp(self.lo, self.hi)
        return torch.fake_quantize_per_tensor_affine(x, scale.to(x.device), zp.to(x.device), ACT_QMIN, ACT_QMAX)


def _weight(m: QConv2d | QLinear) -> torch.Tensor:
    if m.act.calibrating:  # ORT calibrates the float model: the float weights
        return m.weight
    return fake_quant_weight(m.weight, m.per_channel, m.reduce)


class QConv2d(nn.Conv2d):
    """An nn.Conv2d, with the same parameter names, that computes with fake-quantized input and
    weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = _weight(self)
        return self._conv_forward(self.act(x), w, self.bias)


class QLinear(nn.Linear):
    """An nn.Linear, with the same parameter names, that computes with fake-quantized input and
    weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = _weight(self)
        return nn.functional.linear(self.act(x), w, self.bias)


_SWAP = {nn.Conv2d: QConv2d, nn.Linear: QLinear}
_BACK = {QConv2d: nn.Conv2d, QLinear: nn.Linear}
OUTPUT = "qat_output"  # the ActRange of the model's output, a submodule of the root


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def _quantize_output(model: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return getattr(model, OUTPUT)(output)


def prepare(folded: nn.Module, per_channel: bool, reduce: bool, momentum: float) -> nn.Module:
    """Copy the folded model with every Conv2d/Linear fake-quantized, and its output too."""
    model = copy.deepcopy(folded)
    for name, m in list(model.named_modules()):
        if type(m) in _SWAP:
            q = _SWAP[type(m)].__new__(_SWAP[type(m)])
            q.__dict__ = m.__dict__.copy()  # the same parameters, names and settings; another forward
            q.per_channel, q.reduce = per_channel, reduce
            q.act = ActRange(momentum)
            _set(model, name, q)
    setattr(model, OUTPUT, ActRange(momentum))
    model.register_forward_hook(_quantize_output)  # a plain function: deepcopy keeps the hook
    return model


def _ranges(model: nn.Module) -> Iterable[ActRange]:
    return (m for m in model.modules() if isinstance(m, ActRange))


@torch.no_grad()
def calibrate(model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """Set every range to the min/max over ``batches`` of the float model, as PTQ's MinMax
    calibration does."""
    model.eval()
    for r in _ranges(model):
        r.calibrating = True
        r.seen.fill_(False)
    try:
        for x in batches:
            model(x)
    finally:
        for r in _ranges(model):
            r.calibrating = False


@dataclass
class Learned:
    model: nn.Module  # the folded float model with the trained weights (eval mode)
    inputs: dict[str, tuple[float, float]]  # Conv/Linear module name -> (min, max) of its input
    output: tuple[float, float]  # (min, max) of the model's output


def to_float(qat: nn.Module) -> Learned:
    """Return the float model QAT trained, with plain Conv2d/Linear, and the ranges it learned."""
    model = copy.deepcopy(qat).eval()
    model._forward_hooks.clear()
    out = getattr(model, OUTPUT)
    delattr(model, OUTPUT)
    inputs = {}
    for name, m in list(model.named_modules()):
        if type(m) in _BACK:
            inputs[name] = (float(m.act.lo), float(m.act.hi))
            plain = _BACK[type(m)].__new__(_BACK[type(m)])
            plain.__dict__ = m.__dict__.copy()
            del plain._modules["act"], plain.per_channel, plain.reduce
            _set(model, name, plain)
    return Learned(model=model, inputs=inputs, output=(float(out.lo), float(out.hi)))


def overrides(onnx_path: Path, learned: Learned, output_name: str) -> dict[str, list[dict[str, np.ndarray]]]:
    """Build ORT TensorQuantOverrides for every Conv/Gemm input and the output.

    The overrides map each tensor name to its range, as ``{tensor name: [{rmin, rmax}]}``. A
    Conv/Gemm's weight initializer carries its torch module's name, such as
    ``features.0.weight``. A tensor read by several, such as a ResNet block's input that conv1
    and the downsample read, gets the union of their ranges.
    """
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    found: dict[str, tuple[float, float]] = {}
    for node in graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.input) < 2:
            continue
        module = node.input[1].removesuffix(".weight")
        if module not in learned.inputs:
            continue
        lo, hi = learned.inputs[module]
        old = found.get(node.input[0], (lo, hi))
        found[node.input[0]] = (min(lo, old[0]), max(hi, old[1]))
    found[output_name] = learned.output
    return {
        name: [{"rmin": np.array(lo, dtype=np.float32), "rmax": np.array(hi, dtype=np.float32)}]
        for name, (lo, hi) in found.items()
    }


def decide_steps(asked: int | str, ptq_drop: float, max_drop: float, run_steps: int, frac: float) -> tuple[int, str]:
    """Return the number of QAT steps and why. ``auto`` trains ``frac`` of the run's steps, and
    only when PTQ lost more than the limit."""
    if asked != "auto":
        return int(asked), f"--qat-steps {asked}"
    if ptq_drop <= max_drop:
        return 0, f"--qat-steps auto: PTQ int8 lost {ptq_drop:.2f} <= --max-accuracy-drop {max_drop:g}; no QAT"
    steps = max(1, round(frac * run_steps))
    why = (
        f"--qat-steps auto: PTQ int8 lost {ptq_drop:.2f} > --max-accuracy-drop {max_drop:g}; "
        f"QAT for {steps} steps (export.qat_frac={frac:g} of the run's {run_steps})"
    )
    return steps, why


@dataclass
class Trained:
    path: Path  # int8-qat.onnx
    learned: Learned
    qat_model: nn.Module  # the fake-quantized torch model, eval mode (its accuracy is the int8 model's, in torch)
    summary: dict[str, Any]  # the engine's summary of the QAT retrain


def train_and_quantize(
    source: Any,
    folded: nn.Module,
    cfg: ExportConfig,
    steps: int,
    reduce: bool,
    calibration: Callable[[], Iterable[np.ndarray]],
    out: Path,
    log: Path,
) -> Trained:
    """Train ``folded`` with QAT through the engine for ``steps`` steps, and write
    ``out/int8-qat.onnx`` with the learned ranges."""
    from fwk.export import capture, optimize, to_onnx
    from fwk.export import quantize as quant
    from fwk.export.retrain import retrain, retrain_config

    template = prepare(folded, cfg.per_channel, reduce, cfg.qat_momentum)
    calibrate(template, (torch.from_numpy(x) for x in calibration()))  # start where PTQ stands
    run_cfg = retrain_config(source.config, steps, cfg.qat_lr_factor)
    weights, summary = retrain(run_cfg, copy.deepcopy(template), out / "rounds" / "qat")
    trained = copy.deepcopy(template)
    trained.load_state_dict(weights)
    trained.eval()
    learned = to_float(trained)
    raw, fp32 = out / "qat-exported.onnx", out / "qat-fp32.onnx"
    to_onnx.export_onnx(learned.model, capture.example_input(source.data.val), source.data.task, raw, log)
    optimize.optimize(raw, fp32)
    raw.unlink()
    ranges = overrides(fp32, learned, to_onnx.OUTPUT)
    q = quant.static_int8(fp32, out / "int8-qat.onnx", calibration(), cfg.per_channel, reduce, ranges)
    fp32.unlink()  # the int8 model is the artifact; its float weights are in it, dequantizable
    return Trained(path=q.path, learned=learned, qat_model=trained, summary=summary)
