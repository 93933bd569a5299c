"""The Triton kernels fwk has, each in one file.

Each file holds the kernel's pure-PyTorch reference, its ``@triton.jit`` kernel or kernels, an
``autograd.Function`` and a small wrapper.

The wrappers run the Triton kernel where it can run, and the reference elsewhere. A kernel can
run on a CUDA tensor, or on any tensor when ``TRITON_INTERPRET=1`` makes Triton interpret kernels
on the CPU, as the tests do. The engine (``fwk/strategies/kernels.py``) decides whether the
kernels are used at all, from config group ``kernels``.
"""

from __future__ import annotations

import os

import torch


def triton_runs_on(t: torch.Tensor) -> bool:
    """Return whether a Triton kernel can take this tensor."""
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
