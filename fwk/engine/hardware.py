"""What the hardware runs fast: probed from the device, never assumed.

bf16 autocast pays off on CUDA GPUs of compute capability >= 8.0 (Ampere on) and on CPUs
with bf16 units (AMX or AVX512-BF16); elsewhere it is emulated: 12x slower than fp32 for
ResNet-50 at 64 px on an AVX2-only CPU (scripts/bench/precision.py). fp16 autocast runs
on CUDA GPUs of capability >= 5.3, and on CPU only slowly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Features:
    """The facts a precision choice rests on, and a short text of them for the log."""

    bf16_fast: bool
    fp16_works: bool
    text: str


def _cpu_flag(name: str) -> bool:
    probe = getattr(torch.cpu, f"_is_{name}_supported", None)  # private probes: present in torch >= 2.3
    return bool(probe()) if probe is not None else False


def probe(device: torch.device) -> Features:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        return Features(
            bf16_fast=major >= 8,
            fp16_works=(major, minor) >= (5, 3),  # native half arithmetic
            text=f"{name}, compute capability {major}.{minor}",
        )
    amx, avx512_bf16 = _cpu_flag("amx_tile"), _cpu_flag("avx512_bf16")
    capability = torch.backends.cpu.get_cpu_capability()
    units = [n for n, ok in (("AMX", amx), ("AVX512-BF16", avx512_bf16)) if ok]
    text = f"CPU with {' and '.join(units)}" if units else f"CPU without AMX or AVX512-BF16 ({capability})"
    return Features(bf16_fast=amx or avx512_bf16, fp16_works=True, text=text)
