"""What the hardware runs fast: probed from the device, never assumed.

bf16 autocast pays off on CUDA GPUs of compute capability >= 8.0 (Ampere on) and on CPUs
with bf16 units (AMX or AVX512-BF16). Elsewhere it is emulated: 12x slower than fp32 for
ResNet-50 at 64 px on an AVX2-only CPU (benchmarks/precision.py). fp16 autocast runs
on CUDA GPUs of capability >= 5.3, and on CPU only slowly.

``FWK_CPU_BF16=1`` (or ``0``) replaces the CPU's answer on whether it has bf16 units. The
test suite sets it so that every test sees the same CPU whatever machine it runs on, and
runs the bf16 paths with ``1``. The GPU probe is never overridden.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

CPU_BF16_ENV = "FWK_CPU_BF16"


@dataclass(frozen=True)
class Features:
    """The facts a precision choice rests on, and a short text of them for the log."""

    bf16_fast: bool
    fp16_works: bool
    text: str


def _cpu_flag(name: str) -> bool:
    probe = getattr(torch.cpu, f"_is_{name}_supported", None)  # private probes: present in torch >= 2.3
    return bool(probe()) if probe is not None else False


def cpu_units() -> dict[str, bool]:
    """Return {"AMX": yes/no, "AVX512-BF16": yes/no} as this CPU reports them, without the override."""
    return {"AMX": _cpu_flag("amx_tile"), "AVX512-BF16": _cpu_flag("avx512_bf16")}


def _cpu_override() -> bool | None:
    value = os.environ.get(CPU_BF16_ENV, "").strip()
    if not value:
        return None
    if value not in ("0", "1"):
        from fwk.errors import UserError

        raise UserError(f"{CPU_BF16_ENV}={value!r} is not allowed: expected 1 (bf16 units), 0 (none) or unset")
    return value == "1"


def probe(device: torch.device) -> Features:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        return Features(
            bf16_fast=major >= 8,
            fp16_works=(major, minor) >= (5, 3),  # native half arithmetic
            text=f"{name}, compute capability {major}.{minor}",
        )
    units = cpu_units()
    found = ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in units.items())
    text = f"CPU ({torch.backends.cpu.get_cpu_capability()}): {found}"
    bf16_fast = any(units.values())
    override = _cpu_override()
    if override is not None:
        bf16_fast = override
        text += f"; {CPU_BF16_ENV}={int(override)}: bf16 units {'assumed' if override else 'ignored'}"
    return Features(bf16_fast=bf16_fast, fp16_works=True, text=text)


def slow_here(fmt: str, features: Features, device: torch.device) -> str | None:
    """Say why an explicit format runs slowly on this device, or return None."""
    if fmt == "fp16" and device.type == "cpu":
        return "a CPU emulates fp16 (tens of times slower than fp32); precision=auto measures what is fastest"
    if fmt == "bf16" and not features.bf16_fast:
        return f"{features.text} emulates bf16; precision=auto measures what is fastest"
    return None


def choose_format(features: Features, device: torch.device) -> str:
    """Return the hardware's prior: bf16 where it has the units, fp16 on older CUDA GPUs, else fp32.
    precision=auto times it against fp32 before keeping it."""
    if features.bf16_fast:
        return "bf16"
    if device.type == "cuda" and features.fp16_works:
        return "fp16"
    return "fp32"
