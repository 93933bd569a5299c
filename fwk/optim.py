"""Optimizer registry and the learning-rate schedule.

``optim.name`` in the config is a function name here. Weight decay applies to matrices
and convolution kernels only (dim >= 2): biases and norm scales are not decayed.

Composing and validating a config imports this module for its config dataclasses, and
must not import torch (`fwk train --cfg` answers in well under a second): the builders
import torch when they are called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fwk.config.schema import ScheduleConfig
from fwk.registry import Registry, doc

if TYPE_CHECKING:
    import torch
    from torch import nn

OPTIMIZERS = Registry("optimizer")


@dataclass
class AdamWConfig:
    name: str = doc("adamw", "registry name")
    lr: float = doc(1e-3, "peak learning rate")
    beta1: float = doc(0.9, "Adam beta1 (momentum of the gradient mean)")
    beta2: float = doc(0.999, "Adam beta2 (momentum of the squared gradient)")
    eps: float = doc(1e-8, "Adam epsilon added to the denominator")
    weight_decay: float = doc(0.0, "decoupled weight decay on weights with dim >= 2")


@dataclass
class LionConfig:
    name: str = doc("lion", "registry name")
    lr: float = doc(3e-4, "peak learning rate (Lion's steps have size lr per weight: use 3-10x less than AdamW)")
    beta1: float = doc(0.9, "interpolation of momentum and gradient whose sign is the update")
    beta2: float = doc(0.99, "momentum factor of the kept average")
    weight_decay: float = doc(0.0, "decoupled weight decay on weights with dim >= 2 (use 3-10x more than AdamW)")


@dataclass
class SGDConfig:
    name: str = doc("sgd", "registry name")
    lr: float = doc(0.1, "peak learning rate")
    momentum: float = doc(0.9, "momentum factor")
    nesterov: bool = doc(True, "use Nesterov momentum")
    weight_decay: float = doc(0.0, "L2 weight decay on weights with dim >= 2")


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _on_cuda(model: nn.Module) -> bool:
    return next(model.parameters()).is_cuda


@OPTIMIZERS.register(AdamWConfig)
def adamw(cfg: AdamWConfig, model: nn.Module, fused: bool) -> torch.optim.Optimizer:
    import torch

    return torch.optim.AdamW(
        _param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=fused and _on_cuda(model) or None,  # PyTorch's own fused CUDA kernel
    )


@OPTIMIZERS.register(SGDConfig)
def sgd(cfg: SGDConfig, model: nn.Module, fused: bool) -> torch.optim.Optimizer:
    import torch

    return torch.optim.SGD(
        _param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov and cfg.momentum > 0,  # Nesterov needs momentum: plain SGD without it
        fused=fused and _on_cuda(model) or None,
    )


@OPTIMIZERS.register(LionConfig)
def lion(cfg: LionConfig, model: nn.Module, fused: bool) -> torch.optim.Optimizer:
    from fwk.kernels.lion import Lion  # imports Triton: only runs that pick Lion need it

    return Lion(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def build_optimizer(cfg, model: nn.Module, fused: bool = False) -> torch.optim.Optimizer:
    """The registered optimizer; ``fused``: its fused step (fwk's Triton Lion, PyTorch's on CUDA)."""
    return OPTIMIZERS.get(cfg.name).builder(cfg, model, fused=fused)


def state_floats_per_param(cfg) -> float:
    """Optimizer state elements per parameter element, measured: one step of the configured
    optimizer on a small layer (AdamW 2, SGD with momentum 1, Lion 1)."""
    import torch
    from torch import nn

    layer = nn.Linear(8, 8, bias=False)
    optimizer = build_optimizer(cfg, layer)
    layer.weight.grad = torch.ones_like(layer.weight)
    optimizer.step()
    state = optimizer.state[layer.weight]
    held = sum(v.numel() for v in state.values() if isinstance(v, torch.Tensor) and v.numel() > 1)
    return held / layer.weight.numel()


def lr_factor(step: int, cfg: ScheduleConfig, max_steps: int) -> float:
    """Multiplier of the peak lr at ``step``: linear warmup, then the chosen decay."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.decay == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps))
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.decay == "cosine" else 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_schedule(cfg: ScheduleConfig, optimizer: torch.optim.Optimizer, max_steps: int):
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, max_steps))
