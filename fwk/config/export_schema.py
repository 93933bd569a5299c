"""The typed settings of ``fwk export`` (conf/export/), apart from the training config.

A training run does not depend on them, so they are not part of ``Config``. This module
imports neither torch nor Hydra.
"""

from __future__ import annotations

from dataclasses import dataclass

from fwk.registry import doc

QUANTIZATIONS = ("none", "int8", "dynamic_int8", "fp16")


@dataclass
class ExportConfig:
    """The settings of `fwk export` (conf/export/): how a run's model is calibrated, verified and timed.

    It is not part of ``Config``, since a training run does not depend on it. ``fwk export``
    composes this group on its own (``export=OPTION``, ``export.KEY=VALUE``). Only fwk/export/
    reads it.
    """

    name: str = doc("default", "name of the option in conf/export/")
    batch_size: int = doc(64, "samples per batch of the validation and calibration passes")
    val_batches: int = doc(0, "cap on validation batches per model; 0 = the whole validation set")
    calib_batches: int = doc(8, "int8: training batches (of batch_size) whose activation ranges calibrate the model")
    per_channel: bool = doc(True, "int8 / dynamic_int8: one weight scale per output channel (false: one per tensor)")
    reduce_range: str = doc(
        "auto",
        "int8 / dynamic_int8: 7-bit weights, so u8*s8 products cannot overflow int16 on x86 CPUs without "
        "VNNI (AVX2/AVX512 only); auto (on such a CPU), true, false",
    )
    max_batch: int = doc(64, "--format pte: the largest batch the program takes (ExecuTorch plans its memory for it)")
    latency_batch: int = doc(32, "batch N of the latency figures (batch 1 is always timed)")
    threads: int = doc(0, "intra-op threads of onnxruntime and torch while timing; 0 = the cores this process may use")
    warmup: int = doc(3, "untimed runs of each model and batch size before timing")
    iterations: int = doc(20, "timed runs of each model and batch size, interleaved across the models")
    fp32_rtol: float = doc(
        1e-4,
        "largest accepted max|output - torch fp32 output| / max|torch fp32 output| of the folded model and "
        "the fp32 ONNX model: both compute in fp32, only the summation order differs (~1e-6)",
    )
    retrain_frac: float = doc(
        1.0, "--prune lottery_ticket: each round retrains this share of the run's steps, with its schedule"
    )
    finetune_frac: float = doc(0.25, "--prune magnitude/taylor: each round fine-tunes this share of the run's steps")
    finetune_lr_factor: float = doc(0.1, "--prune magnitude/taylor: the fine-tune's lr as a share of the run's")
    taylor_batches: int = doc(4, "--prune taylor: training batches (of batch_size) whose gradients rank the channels")
    round_to: int = doc(
        8, "--prune: channel counts kept at multiples of this where every layer is wide enough; 1 = exact counts"
    )
    # quantization-aware training (fwk export --qat-steps; int8 only)
    qat_frac: float = doc(0.1, "--qat-steps auto: QAT steps as a share of the run's train.max_steps (at least 1)")
    qat_lr_factor: float = doc(0.1, "QAT learning rate = the run's optim.lr x this factor (a fine-tune, not a new run)")
    qat_momentum: float = doc(
        0.01, "QAT: weight of each training batch's min/max in the moving average of an activation's int8 range"
    )
