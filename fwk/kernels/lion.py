"""The Lion optimizer: its reference step, a fused Triton step, and the optimizer.

Lion comes from Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms".
A step does this per parameter, with gradient g and momentum m:

- ``update = sign(beta1 * m + (1 - beta1) * g)``
- ``p = p * (1 - lr * weight_decay) - lr * update``
- ``m = beta2 * m + (1 - beta2) * g``

The reference is those three lines in PyTorch, which make three passes over memory and a
temporary per line. The Triton kernel reads p, g, m once and writes p, m once. PyTorch has no Lion.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import triton
import triton.language as tl

from fwk.kernels import triton_runs_on


def reference_step(
    p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, lr: float, beta1: float, beta2: float, weight_decay: float
) -> None:
    update = (m * beta1 + g * (1 - beta1)).sign_()
    p.mul_(1 - lr * weight_decay).add_(update, alpha=-lr)
    m.mul_(beta2).add_(g, alpha=1 - beta2)


@triton.jit
def _step(P, G, M, n, lr, beta1, beta2, decay, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    p = tl.load(P + offsets, mask=mask).to(tl.float32)
    g = tl.load(G + offsets, mask=mask).to(tl.float32)
    m = tl.load(M + offsets, mask=mask).to(tl.float32)
    c = beta1 * m + (1.0 - beta1) * g
    update = tl.where(c > 0, 1.0, tl.where(c < 0, -1.0, 0.0))
    p = p * decay - lr * update
    m = beta2 * m + (1.0 - beta2) * g
    tl.store(P + offsets, p.to(P.dtype.element_ty), mask=mask)
    tl.store(M + offsets, m.to(M.dtype.element_ty), mask=mask)


def fused_step(
    p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, lr: float, beta1: float, beta2: float, weight_decay: float
) -> None:
    n = p.numel()
    block = 1024
    _step[(triton.cdiv(n, block),)](p, g, m, n, lr, beta1, beta2, 1.0 - lr * weight_decay, BLOCK=block)


class Lion(torch.optim.Optimizer):
    """The Lion optimizer, with decoupled weight decay.

    ``fused`` runs the Triton step where it can run."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        fused: bool = False,
    ) -> None:
        if lr <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"Lion needs lr > 0 and betas in [0, 1), got lr={lr}, betas={betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})
        self.fused = fused

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m = state["exp_avg"]
                contiguous = p.is_contiguous() and p.grad.is_contiguous() and m.is_contiguous()
                fast = self.fused and contiguous and triton_runs_on(p)
                (fused_step if fast else reference_step)(p, p.grad, m, group["lr"], beta1, beta2, group["weight_decay"])
        return loss
