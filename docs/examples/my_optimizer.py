"""An optimizer of your own: a ``torch.optim.Optimizer`` class, named by ``optim._target_``.

Train the default recipe with it:

    PYTHONPATH=. fwk train optim._target_=my_optimizer.Signum optim.lr=2e-3 +optim.momentum=0.9

fwk builds the class on the model's parameters in two groups, the weights of two or more
dimensions with ``optim.weight_decay`` and the rest without, so the class must read
``weight_decay`` from its groups. Every other ``optim.*`` key is passed as a keyword
argument, and a key the class does not take is one line before the run starts. The
schedule (``schedule=cosine`` by default) drives ``lr`` as it does for fwk's own.
"""

from __future__ import annotations

import torch


class Signum(torch.optim.Optimizer):
    """Step each weight by the sign of its momentum (signSGD with momentum, Bernstein et al. 2018)."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.9, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch's signature
        loss = torch.enable_grad()(closure)() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad, alpha=1 - group["momentum"])
                p.mul_(1 - group["lr"] * group["weight_decay"])  # decoupled weight decay, as AdamW's
                p.add_(buf.sign(), alpha=-group["lr"])
        return loss
