"""What to change, derived from the profile's figures: each line quotes the figure that
triggered it and the threshold it crossed. No figure over a threshold, no advice.

``advise`` reads one flat dict of signals (``signals`` builds it from the figures and the
run's settings), so each rule can be tested on hand-made numbers.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

DATA_WAIT = 0.10  # share of the step spent waiting for the loader
COMM = 0.15  # share of the step in collectives (parallel.adapt.threshold's default)
FP32_COMPUTE = 0.20  # share of op time in fp32 convs/matmuls on hardware with fast bf16
BF16_COMPUTE = 0.20  # share of op time in bf16 convs/matmuls on hardware that emulates bf16
NCHW_AMP = 0.10  # share of op time in NCHW convolutions under AMP
SHORT_TIME = 0.30  # share of kernel (CPU: leaf op) time in calls shorter than figures.SHORT_US
MIN_CALLS = 100  # ... counted only with at least this many calls per step
MEMORY = 0.85  # peak allocated memory as a share of the device's


@dataclass
class Advice:
    rule: str
    figure: str  # the measured figure, with its number and the threshold it crossed
    change: str  # what to change

    @property
    def line(self) -> str:
        return f"{self.figure}: {self.change}"


def signals(figs: dict[str, Any], settings: dict[str, Any], hardware: dict[str, Any]) -> dict[str, Any]:
    """Gather the numbers and settings the rules read."""
    shares = {r["part"]: r["share"] for r in figs["split"]["rows"]}
    return {
        "device": figs["device"],
        "data_share": shares.get("data", 0.0),
        "comm_share": shares.get("communication", 0.0),
        **figs["facts"],
        "peak_memory_share": figs["memory"]["peak_share"],
        "peak_memory_mb": figs["memory"]["peak_mb"],
        "device_memory_mb": figs["memory"]["device_mb"],
        "bf16_fast": hardware["bf16_fast"],
        "hardware": hardware["text"],
        **settings,
    }


def _pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else f"{x:.1%}"


def advise(s: dict[str, Any]) -> list[Advice]:
    out = []
    if s["data_share"] > DATA_WAIT:
        workers = s["num_workers"]  # -1: loader=auto chose
        more = max(2, min(8, (os.cpu_count() or 2) // 2)) if workers <= 0 else workers * 2
        now = "auto" if workers < 0 else workers
        pin = " and loader.pin_memory=true" if s["device"] == "cuda" and str(s["pin_memory"]).lower() == "false" else ""
        out.append(
            Advice(
                "data_wait",
                f"data wait {_pct(s['data_share'])} of the step (> {_pct(DATA_WAIT)})",
                f"load ahead in worker processes: loader.num_workers={more} (now {now}){pin}",
            )
        )
    if s["comm_share"] > COMM:
        hook = "powersgd" if s["comm_hook"] in ("fp16", "bf16") else "bf16" if s["bf16_fast"] else "fp16"
        out.append(
            Advice(
                "communication",
                f"communication {_pct(s['comm_share'])} of the step (> {_pct(COMM)})",
                f"compress gradients: parallel.comm_hook={hook} (now {s['comm_hook']}), or larger "
                "parallel.bucket_cap_mb / train.accum_steps",
            )
        )
    if s["fp32_compute_share"] > FP32_COMPUTE and s["bf16_fast"] and s["precision"] == "fp32":
        out.append(
            Advice(
                "fp32",
                f"fp32 convolutions/matmuls {_pct(s['fp32_compute_share'])} of op time (> {_pct(FP32_COMPUTE)}) "
                f"on {s['hardware']}, which has fast bf16",
                f"precision=auto (bf16 autocast; now precision={s['precision']})",
            )
        )
    if s["bf16_compute_share"] > BF16_COMPUTE and not s["bf16_fast"]:
        out.append(
            Advice(
                "bf16_emulated",
                f"bf16 convolutions/matmuls {_pct(s['bf16_compute_share'])} of op time (> {_pct(BF16_COMPUTE)}) "
                f"on {s['hardware']}, which has no fast bf16",
                f"precision=auto (it picks {'fp16' if s['device'] == 'cuda' else 'fp32'} here; now "
                f"precision={s['precision']})",
            )
        )
    if s["nchw_amp_conv_share"] > NCHW_AMP:
        out.append(
            Advice(
                "channels_last",
                f"NCHW convolutions under autocast {_pct(s['nchw_amp_conv_share'])} of op time (> {_pct(NCHW_AMP)})",
                "precision.channels_last=true (tensor cores and oneDNN want NHWC under AMP)",
            )
        )
    if s["calls_per_step"] >= MIN_CALLS and s["short_time_share"] > SHORT_TIME and s["jit"] != "compile":
        what = "kernels" if s["device"] == "cuda" else "op calls"
        change = (
            "jit=auto (compiles once steps are stable; it fuses small ops into fewer kernels)"
            if s["jit"] == "off"
            else "jit=compile (jit=auto compiles only runs longer than jit.min_remaining_s; it fuses small ops)"
        )
        out.append(
            Advice(
                "small_kernels",
                f"{_pct(s['short_time_share'])} of {what} time in calls under 20 µs (> {_pct(SHORT_TIME)}; "
                f"{s['calls_per_step']:.0f} {what} per step, {_pct(s['short_call_share'])} of them that short)",
                change,
            )
        )
    if s["peak_memory_share"] > MEMORY and s["memory"] not in ("checkpoint", "offload"):
        out.append(
            Advice(
                "memory",
                f"peak memory {s['peak_memory_mb'] / 1024:.1f} GiB, {_pct(s['peak_memory_share'])} of the "
                f"{s['device_memory_mb'] / 1024:.1f} GiB {s['device']} memory (> {_pct(MEMORY)})",
                f"memory=checkpoint (recompute activations in backward; now memory={s['memory']})",
            )
        )
    return out


def as_dicts(advice: list[Advice]) -> list[dict[str, str]]:
    return [{**asdict(a), "line": a.line} for a in advice]
