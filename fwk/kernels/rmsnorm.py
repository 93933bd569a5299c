"""RMSNorm over the last dimension: reference, Triton kernels, autograd.Function, module.

It computes y = x / sqrt(mean(x^2) + eps) * w. Forward saves 1/rms per row. Backward writes dx
per row and sums dw over rows per block of columns, as in layernorm.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn

from fwk.kernels import triton_runs_on


def reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float() if weight is not None else y).to(x.dtype)


@triton.jit
def _forward(X, Y, W, Rstd, stride, N, eps, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    y = x * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def _backward_dx(DY, DX, X, W, Rstd, stride, N, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(Rstd + row)
    xhat = x * rstd
    wdy = dy
    if HAS_W:
        wdy = dy * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dx = (wdy - xhat * (tl.sum(xhat * wdy, axis=0) / N)) * rstd
    tl.store(DX + row * stride + cols, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _backward_dw(DY, X, Rstd, DW, stride, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, M, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        offsets = rows[:, None] * stride + cols[None, :]
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + rows, mask=rows < M, other=0.0)
        dw += dy * x * rstd[:, None]
    tl.store(DW + cols, tl.sum(dw, axis=0), mask=cols < N)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):  # noqa: ANN001, ANN205
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()  # (M, N)
        M, N = x2.shape
        y = torch.empty_like(x2)
        rstd = torch.empty(M, dtype=torch.float32, device=x.device)
        w = weight if weight is not None else x2  # unused pointer without a weight
        _forward[(M,)](x2, y, w, rstd, x2.stride(0), N, eps, HAS_W=weight is not None, BLOCK=triton.next_power_of_2(N))
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape = shape
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):  # noqa: ANN001, ANN205
        x2, weight, rstd = ctx.saved_tensors
        M, N = x2.shape
        dy2 = dy.reshape(M, N).contiguous()
        dx = torch.empty_like(x2)
        w = weight if weight is not None else x2
        _backward_dx[(M,)](
            dy2, dx, x2, w, rstd, x2.stride(0), N, HAS_W=weight is not None, BLOCK=triton.next_power_of_2(N)
        )
        dw = None
        if weight is not None:
            dw32 = torch.empty(N, dtype=torch.float32, device=x2.device)
            block_n = min(64, triton.next_power_of_2(N))
            _backward_dw[(triton.cdiv(N, block_n),)](
                dy2, x2, rstd, dw32, x2.stride(0), M, N, BLOCK_M=32, BLOCK_N=block_n
            )
            dw = dw32.to(weight.dtype)
        return dx.view(ctx.shape), dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Apply RMSNorm over the last dimension, with the Triton kernels where they run, else the reference."""
    if not triton_runs_on(x):
        return reference(x, weight, eps)
    return _RMSNorm.apply(x, weight, eps)


class RMSNorm(nn.RMSNorm):
    """An ``nn.RMSNorm`` computed by the Triton kernels, with the same parameters and state_dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            return super().forward(x)
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return rms_norm(x, self.weight, eps)
