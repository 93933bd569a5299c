"""Triton kernels, each in one file with its pure-PyTorch reference, its ``@triton.jit``
kernel(s), an ``autograd.Function`` and a small wrapper.

The wrappers run the Triton kernel where it can run (a CUDA tensor, or any tensor when
``TRITON_INTERPRET=1`` makes Triton interpret kernels on the CPU, as the tests do) and
the reference elsewhere. The engine (``fwk/strategies/kernels.py``) decides whether the
kernels are used at all (config group ``kernels``).
"""

from __future__ import annotations

import os

import torch


def triton_runs_on(t: torch.Tensor) -> bool:
    """Whether a Triton kernel can take this tensor."""
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
