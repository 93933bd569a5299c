"""LayerNorm over the last dimension: reference, Triton kernels, autograd.Function, module.

In forward, one program per row computes mean and 1/std in fp32 and writes y. Mean and rstd
are saved. In backward, one program per row writes dx, and one program per block of columns
sums dw and db over all rows. There are no atomics, so the result does not depend on scheduling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from fwk.kernels import triton_runs_on


def reference(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


@triton.jit
def _forward(X, Y, W, B, Mean, Rstd, stride, N, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
    y = xc * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)


@triton.jit
def _backward_dx(DY, DX, X, W, Mean, Rstd, stride, N, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    wdy = dy
    if HAS_W:
        wdy = dy * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.sum(xhat * wdy, axis=0) / N
    c2 = tl.sum(wdy, axis=0) / N
    dx = (wdy - (xhat * c1 + c2)) * rstd
    tl.store(DX + row * stride + cols, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _backward_dwdb(DY, X, Mean, Rstd, DW, DB, stride, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, M, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        offsets = rows[:, None] * stride + cols[None, :]
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + rows, mask=rows < M, other=0.0)
        rstd = tl.load(Rstd + rows, mask=rows < M, other=0.0)
        xhat = (x - mean[:, None]) * rstd[:, None]
        dw += tl.where(mask, dy * xhat, 0.0)
        db += dy
    tl.store(DW + cols, tl.sum(dw, axis=0), mask=cols < N)
    tl.store(DB + cols, tl.sum(db, axis=0), mask=cols < N)


def _block(n: int) -> int:
    return triton.next_power_of_2(n)


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):  # noqa: ANN001, ANN205
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()  # (M, N)
        M, N = x2.shape
        y = torch.empty_like(x2)
        mean = torch.empty(M, dtype=torch.float32, device=x.device)
        rstd = torch.empty(M, dtype=torch.float32, device=x.device)
        dummy = x2  # unused pointer when there is no weight or bias
        _forward[(M,)](
            x2, y, weight if weight is not None else dummy, bias if bias is not None else dummy,
            mean, rstd, x2.stride(0), N, eps,
            HAS_W=weight is not None, HAS_B=bias is not None, BLOCK=_block(N),
        )  # fmt: skip
        ctx.save_for_backward(x2, weight, bias, mean, rstd)
        ctx.shape = shape
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):  # noqa: ANN001, ANN205
        x2, weight, bias, mean, rstd = ctx.saved_tensors
        M, N = x2.shape
        dy2 = dy.reshape(M, N).contiguous()
        dx = torch.empty_like(x2)
        _backward_dx[(M,)](
            dy2, dx, x2, weight if weight is not None else x2, mean, rstd, x2.stride(0), N,
            HAS_W=weight is not None, BLOCK=_block(N),
        )  # fmt: skip
        dw = db = None
        if weight is not None or bias is not None:
            dw32 = torch.empty(N, dtype=torch.float32, device=x2.device)
            db32 = torch.empty(N, dtype=torch.float32, device=x2.device)
            block_n = min(64, _block(N))
            _backward_dwdb[(triton.cdiv(N, block_n),)](
                dy2, x2, mean, rstd, dw32, db32, x2.stride(0), M, N, BLOCK_M=32, BLOCK_N=block_n
            )
            dw = dw32.to(weight.dtype) if weight is not None else None
            db = db32.to(bias.dtype) if bias is not None else None
        return dx.view(ctx.shape), dw, db, None


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    """Apply LayerNorm over the last dimension, with the Triton kernels where they run, else the reference."""
    if not triton_runs_on(x):
        return reference(x, weight, bias, eps)
    return _LayerNorm.apply(x, weight, bias, eps)


class LayerNorm(nn.LayerNorm):
    """An ``nn.LayerNorm`` computed by the Triton kernels, with the same parameters and state_dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            return super().forward(x)
        return layer_norm(x, self.weight, self.bias, self.eps)
