"""Muon for the hidden weight matrices, AdamW for the rest, as one optimizer object.

``torch.optim.Muon`` orthogonalizes each matrix's momentum by Newton-Schulz before the
update. It is the optimizer of modded-nanogpt's speedrun records, by Keller Jordan et al.
It is defined for matrices only, and works best on the hidden ones. The embeddings, the
output head (the last Linear, or a weight tied to an embedding), norms, biases, and
convolution kernels go to AdamW, with its own lr. Convolution kernels are 4-D, and torch's
Muon takes no other shape than a matrix. Muon's lr is scaled per matrix to match AdamW's
update size by ``adjust_lr_fn="match_rms_adamw"``, so one lr setting works for both, by
Moonshot's rule.

Both optimizers' states are in one state dict, and the learning-rate scheduler scales
every parameter group of both, so resume stays exact.

torch's Muon always runs its Newton-Schulz iteration in bf16, the speedrun's choice for GPUs.
On a device whose bf16 matmuls are slow, that iteration dominated gpt_stdlib_fast's step. A
CPU without AVX512-BF16 or AMX emulates them, 12-19x slower than fp32. fwk runs the same
iteration with torch's coefficients, in ``newton_schulz``, in the dtype the training step
computes in. That dtype is ``compute_dtype``, the precision strategy's: bf16 where it
measured or was asked for bf16 autocast, else fp32.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn


def split(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter], list[str]]:
    """Split the trainable parameters between Muon, which takes the hidden 2-D weights, and AdamW.

    Return Muon's parameters, AdamW's, and Muon's parameter names."""
    named = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    head = {id(linears[-1].weight)} if linears else set()
    muon, adamw, names = [], [], []
    for p in {id(p): p for p in model.parameters() if p.requires_grad}.values():
        if p.dim() == 2 and id(p) not in embeddings and id(p) not in head:
            muon.append(p)
            names.append(named[id(p)])
        else:
            adamw.append(p)
    return muon, adamw, names


def check_model(model: nn.Module) -> None:
    """Check before the run that the model has a hidden matrix for Muon, and raise a UserError if not."""
    if not split(model)[0]:
        from fwk.errors import UserError

        raise UserError(
            f"optim=muon: {type(model).__name__} has no hidden weight matrices for Muon (it orthogonalizes 2-D "
            "weights; embeddings, the head and convolutions stay with AdamW); use optim=adamw"
        )


def newton_schulz(
    grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """Compute torch's ``_zeropower_via_newtonschulz`` in ``dtype`` instead of bf16.

    That function, in torch/optim/_muon.py, is the quintic iteration of Keller Jordan's Muon.
    In bf16 the result is bit for bit torch's."""
    a, b, c = ns_coefficients
    x = grad.to(dtype)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


@contextlib.contextmanager
def newton_schulz_in(dtype: torch.dtype) -> Iterator[None]:
    """Choose the dtype that ``torch.optim.Muon.step`` orthogonalizes in, within this context.

    When the step computes in ``dtype`` bf16, it orthogonalizes in bf16, by torch's own function,
    untouched. Otherwise it orthogonalizes in fp32, fp16 autocast included, because the iteration
    is validated in bf16 and fp32 only. A torch whose Muon is laid out otherwise keeps its bf16."""
    from torch.optim import _muon

    own = getattr(_muon, "_zeropower_via_newtonschulz", None)
    if dtype == torch.bfloat16 or own is None:
        yield
        return
    _muon._zeropower_via_newtonschulz = functools.partial(newton_schulz, dtype=torch.float32)
    try:
        yield
    finally:
        _muon._zeropower_via_newtonschulz = own


def _bf16() -> torch.dtype:
    return torch.bfloat16


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer in front of ``torch.optim.Muon`` and ``torch.optim.AdamW``.

    Its ``param_groups`` are theirs, Muon's first, so schedulers and clipping see every one.
    ``compute_dtype()`` returns the dtype of Muon's Newton-Schulz step now. By default that is
    bf16, torch's."""

    def __init__(
        self, muon: torch.optim.Muon, adamw: torch.optim.AdamW, compute_dtype: Callable[[], torch.dtype] = _bf16
    ) -> None:
        self.muon, self.adamw, self.compute_dtype = muon, adamw, compute_dtype
        params = [p for g in (*muon.param_groups, *adamw.param_groups) for p in g["params"]]
        super().__init__(params, {})
        self.param_groups = [*muon.param_groups, *adamw.param_groups]  # the same dicts: lr changes reach both

    @property  # type: ignore[override]
    def state(self) -> dict:  # per-parameter state, read by fwk's memory estimate
        return {**self.muon.state, **self.adamw.state}

    @state.setter
    def state(self, value: Any) -> None:  # Optimizer.__init__ sets an empty one
        pass

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        with newton_schulz_in(self.compute_dtype()):
            loss = self.muon.step(closure)
        self.adamw.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = [*self.muon.param_groups, *self.adamw.param_groups]
