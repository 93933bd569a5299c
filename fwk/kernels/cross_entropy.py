"""Softmax cross-entropy of a linear head, computed in chunks of rows.

The (rows, vocab) logits and their gradient exist one chunk at a time, never for the whole batch.

For each chunk, a matmul gives logits = h @ W^T. Then one kernel program per row takes an online
max / sum-exp pass over the vocabulary, which gives the loss. A second pass overwrites the logits
with their gradient, softmax - (1 - eps) * onehot - eps / V, scaled by 1/N. dh and dW follow from
two more matmuls. Everything is computed in forward, as Liger-Kernel does, so backward only
scales the saved gradients.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fwk.kernels import triton_runs_on


def reference(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Compute the loss the plain way: the whole (N, V) logits in fp32, then cross-entropy.

    The cross-entropy is the mean over rows."""
    return F.cross_entropy((hidden @ weight.t()).float(), target, label_smoothing=label_smoothing)


@triton.jit
def _loss_and_grad(Logits, Target, Loss, stride, V, scale, smoothing, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    ptr = Logits + row * stride
    target = tl.load(Target + row)
    m = float("-inf")
    s = 0.0
    total = 0.0
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(ptr + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
        total += tl.sum(tl.where(cols < V, x, 0.0), axis=0)
    lse = m + tl.log(s)
    x_target = tl.load(ptr + target).to(tl.float32)
    tl.store(Loss + row, lse - (1.0 - smoothing) * x_target - smoothing / V * total)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(ptr + cols, mask=cols < V, other=0.0).to(tl.float32)
        grad = tl.exp(x - lse) - smoothing / V
        grad = tl.where(cols == target, grad - (1.0 - smoothing), grad)
        tl.store(ptr + cols, (grad * scale).to(Logits.dtype.element_ty), mask=cols < V)


def _chunk_torch(logits: torch.Tensor, target: torch.Tensor, scale: float, smoothing: float) -> torch.Tensor:
    """Compute in PyTorch what the kernel computes: return the per-row losses.

    The logits are overwritten by their gradient."""
    logp = logits.float().log_softmax(-1)  # (n, V)
    V = logits.shape[-1]
    loss = -(1.0 - smoothing) * logp.gather(1, target[:, None]).squeeze(1) - smoothing / V * logp.sum(-1)
    grad = logp.exp_() - smoothing / V
    grad.scatter_add_(1, target[:, None], torch.full_like(grad[:, :1], -(1.0 - smoothing)))
    logits.copy_(grad * scale)
    return loss


def _chunk_triton(logits: torch.Tensor, target: torch.Tensor, scale: float, smoothing: float) -> torch.Tensor:
    n, V = logits.shape
    loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    block = min(4096, triton.next_power_of_2(V))
    _loss_and_grad[(n,)](logits, target, loss, logits.stride(0), V, scale, smoothing, BLOCK=block)
    return loss


def chunk_rows(n: int, vocab: int, width: int) -> int:
    """Return the rows per chunk that make a chunk's logits about the size of the hidden states."""
    return max(1, math.ceil(n / math.ceil(vocab / max(width, 1))))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, smoothing, use_triton):  # noqa: ANN001, ANN205
        n = hidden.shape[0]
        rows = chunk_rows(n, weight.shape[0], weight.shape[1])
        chunk = _chunk_triton if use_triton else _chunk_torch
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, n, rows):
            h = hidden[start : start + rows]
            logits = (h @ weight.t()).contiguous()  # (rows, V), the only logits alive
            loss += chunk(logits, target[start : start + rows].contiguous(), 1.0 / n, smoothing).sum()
            grad_h[start : start + rows] = logits @ weight.to(logits.dtype)
            grad_w += (logits.t() @ h.to(logits.dtype)).float()
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return loss / n

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out.to(grad_h.dtype), grad_w * grad_out.to(grad_w.dtype), None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Return the mean cross-entropy of ``hidden @ weight.T`` against ``target``, computed in chunks.

    ``hidden`` is (N, C) and ``weight`` is (V, C). ``target`` holds the N rows' int64 class indices.
    The Triton kernel computes the loss where it runs, and elsewhere the same chunked algorithm
    runs in PyTorch.
    """
    return _LinearCrossEntropy.apply(hidden, weight, target, label_smoothing, triton_runs_on(hidden))
