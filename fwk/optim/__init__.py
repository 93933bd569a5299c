"""The optimizer registry and the learning-rate schedule.

``optim.name`` in the config is a function name here, or ``optim._target_`` names an
optimizer class of your own (``optim=custom``, built by ``_own``). Weight decay applies to
matrices and convolution kernels only, those with dim >= 2. Biases and norm scales are not
decayed.

Composing and validating a config imports this module for its config dataclasses, and it
must not import torch, so that `fwk train --cfg` answers in well under a second. The builders
import torch when they are called.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fwk.config.methods import Rule
from fwk.config.schema import ScheduleConfig
from fwk.registry import Registry, doc

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fwk.config.schema import Config

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


@dataclass
class MuonConfig:
    name: str = doc("muon", "registry name")
    lr: float = doc(2e-3, "peak lr of both parts (Muon's is scaled per matrix to AdamW's update size)")
    momentum: float = doc(0.95, "Muon: momentum of the orthogonalized update")
    nesterov: bool = doc(True, "Muon: Nesterov momentum")
    ns_steps: int = doc(5, "Muon: Newton-Schulz iterations per step")
    weight_decay: float = doc(0.0, "decoupled weight decay of Muon's matrices and of AdamW's weights with dim >= 2")
    adamw_lr: float = doc(0.0, "AdamW's peak lr for the embeddings, head, norms, biases and convs; 0 = lr")
    beta1: float = doc(0.9, "AdamW beta1")
    beta2: float = doc(0.95, "AdamW beta2")
    eps: float = doc(1e-8, "AdamW epsilon")


@OPTIMIZERS.register(MuonConfig)
def muon(
    cfg: MuonConfig, model: nn.Module, fused: bool, compute_dtype: Callable[[], torch.dtype] | None = None
) -> torch.optim.Optimizer:
    import torch

    from fwk.optim.muon import MuonAdamW, split

    matrices, rest, _ = split(model)
    decay = [p for p in rest if p.dim() >= 2]
    no_decay = [p for p in rest if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    adamw = torch.optim.AdamW(
        [g for g in groups if g["params"]] or [{"params": []}],
        lr=cfg.adamw_lr or cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=fused and _on_cuda(model) or None,
    )
    if not matrices:  # a recipe's muon on a model without hidden matrices: AdamW alone (the trainer says so)
        return adamw
    muon_part = torch.optim.Muon(
        matrices,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        ns_steps=cfg.ns_steps,
        adjust_lr_fn="match_rms_adamw",
    )
    return MuonAdamW(muon_part, adamw, *([compute_dtype] if compute_dtype else []))


@dataclass
class ScheduleFreeConfig:
    name: str = doc("adamw_schedulefree", "registry name")
    lr: float = doc(2.5e-3, "learning rate after warmup (schedule.warmup_steps); no decay: the average replaces it")
    beta1: float = doc(0.9, "interpolation between the average and the fast iterate (Adam's beta1 role)")
    beta2: float = doc(0.999, "momentum of the squared gradient")
    eps: float = doc(1e-8, "epsilon added to the denominator")
    weight_decay: float = doc(0.0, "weight decay on weights with dim >= 2, applied at the training point")
    weight_lr_power: float = doc(2.0, "each step's weight in the average is lr ** this (warmup steps count less)")
    bn_batches: int = doc(
        8, "training batches that recompute BatchNorm statistics at the averaged weights before each eval"
    )

    def rules(self, c: Config) -> Iterator[Rule]:
        allowed = "an integer >= 0 (0 = keep the running statistics)"
        yield self.bn_batches >= 0, "optim.bn_batches", self.bn_batches, allowed
        yield (
            "ema" not in c.methods,
            "methods",
            list(c.methods),
            "no ema with optim=adamw_schedulefree (it evaluates an average of the weights already); drop one",
        )


@OPTIMIZERS.register(ScheduleFreeConfig)
def adamw_schedulefree(cfg: ScheduleFreeConfig, model: nn.Module, fused: bool) -> torch.optim.Optimizer:
    from schedulefree import AdamWScheduleFree

    return AdamWScheduleFree(
        _param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        warmup_steps=0,  # fwk's scheduler warms up (schedule.warmup_steps). The package weighs steps by lr.
        weight_lr_power=cfg.weight_lr_power,
    )


def is_schedule_free(optimizer: torch.optim.Optimizer) -> bool:
    """Return whether ``optimizer`` is schedule-free.

    A schedule-free optimizer's groups carry the ``schedulefree`` package's ``train_mode`` flag."""
    return bool(optimizer.param_groups) and "train_mode" in optimizer.param_groups[0]


def registered_name(cfg) -> str | None:
    """Return the registered optimizer's name, or None for a class of your own (``optim._target_``)."""
    return None if isinstance(cfg, dict) else cfg.name


def build_optimizer(
    cfg, model: nn.Module, fused: bool = False, compute_dtype: Callable[[], torch.dtype] | None = None
) -> torch.optim.Optimizer:
    """Build the registered optimizer, or your own class (``optim._target_``).

    ``fused`` asks for its fused step: fwk's Triton Lion, or PyTorch's on CUDA. ``compute_dtype()``
    returns the dtype the training step computes in now, and Muon runs its Newton-Schulz step in
    it. When ``compute_dtype`` is None, Muon uses torch's bf16."""
    if isinstance(cfg, dict):
        return _own(cfg, model)
    extra = {"compute_dtype": compute_dtype} if compute_dtype is not None and cfg.name == "muon" else {}
    return OPTIMIZERS.get(cfg.name).builder(cfg, model, fused=fused, **extra)


def _own(cfg: dict, model: nn.Module) -> torch.optim.Optimizer:
    """Build a ``torch.optim.Optimizer`` of your own, named by ``optim._target_=pkg.Class``.

    It is built on the model's trainable parameters. With ``optim.weight_decay`` they form two
    groups, and the weights with dim >= 2 are decayed, as fwk's own optimizers do. Every other
    key is a keyword argument."""
    import torch
    from hydra.utils import get_object

    from fwk.config.locate import import_from_working_folder
    from fwk.errors import UserError

    target, args = cfg["_target_"], {k: v for k, v in cfg.items() if k != "_target_"}
    try:
        import_from_working_folder(target)
        cls = get_object(target)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to fix: one line
        raise UserError(f"optim._target_={target}: cannot import it ({type(exc).__name__}: {exc})") from None
    if "weight_decay" in args:
        params: Any = _param_groups(model, args.pop("weight_decay"))
    else:
        params = [p for p in model.parameters() if p.requires_grad]
    try:
        optimizer = cls(params, **args)
    except Exception as exc:  # noqa: BLE001 - the user's class refused its settings: one line, its reason
        given = ", ".join(f"optim.{k}={v}" for k, v in args.items()) or "no settings"
        raise UserError(
            f"optim._target_={target} cannot be built with {given} ({type(exc).__name__}: {exc}); "
            "give only the arguments of its __init__ after the parameters"
        ) from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"optim._target_={target} made a {type(optimizer).__name__}, not a torch.optim.Optimizer")
    return optimizer


def peak_lr(cfg) -> float | None:
    """Return the configured peak learning rate.

    It is None for a class of your own without ``optim.lr``, which then takes its default."""
    return cfg.get("lr") if isinstance(cfg, dict) else cfg.lr


def with_lr(cfg, lr: float):
    """Return the same optimizer settings with peak learning rate ``lr``."""
    if isinstance(cfg, dict):
        return {**cfg, "lr": lr}
    return dataclasses.replace(cfg, lr=lr)


WHOLE_TENSORS = {  # optimizers that refuse a sharded model, and why
    "muon": "Muon's Newton-Schulz step needs whole matrices",
    "adamw_schedulefree": "fwk keeps its averaged weights (for evaluation and export) whole",
}


def check_sharding(cfg, sharded: bool) -> None:
    """Refuse an optimizer that needs whole tensors on a sharded model, in one line.

    The model is sharded here when parallel=auto chose FSDP for a model too big to replicate.
    validate refuses parallel=fsdp/hsdp itself."""
    if sharded and registered_name(cfg) in WHOLE_TENSORS:
        from fwk.errors import UserError

        raise UserError(
            f"optim={cfg.name} with a sharded model (parallel=auto chose FSDP): {WHOLE_TENSORS[cfg.name]}; "
            "use optim=adamw, or parallel=ddp if the model fits each device"
        )


def notes(cfg, schedule: ScheduleConfig, optimizer: torch.optim.Optimizer, model: nn.Module) -> list[str]:
    """Return what the built optimizer does that its config does not say, one line each."""
    from fwk.optim.muon import MuonAdamW

    name = registered_name(cfg)
    if name == "muon" and not isinstance(optimizer, MuonAdamW):
        return [f"optim=muon: {type(model).__name__} has no hidden weight matrices for Muon; AdamW trains all of it"]
    if name == "adamw_schedulefree":
        unused = f" (schedule.decay={schedule.decay} unused)" if schedule.decay != "constant" else ""
        return [
            f"optim=adamw_schedulefree: warmup over {schedule.warmup_steps} steps, then no decay{unused}; "
            "evaluation, best checkpoints and fwk export use the averaged weights"
        ]
    return []


def state_floats_per_param(cfg) -> float:
    """Measure the optimizer state's elements per parameter element.

    It takes one step of the configured optimizer on a small hidden layer. AdamW holds 2, SGD
    with momentum 1, Lion 1, Muon 1 and schedule-free 2."""
    import torch
    from torch import nn

    net = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False))  # a hidden layer and a head
    layer = net[0]
    optimizer = build_optimizer(cfg, net)
    if is_schedule_free(optimizer):  # steps only in train mode
        optimizer.train()
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    state = optimizer.state[layer.weight]
    held = sum(v.numel() for v in state.values() if isinstance(v, torch.Tensor) and v.numel() > 1)
    return held / layer.weight.numel()


def lr_factor(step: int, cfg: ScheduleConfig, max_steps: int) -> float:
    """Return the multiplier of the peak lr at ``step``: linear warmup, then the chosen decay."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.decay == "constant":
        return 1.0
    if cfg.decay == "wsd":  # stable at the peak, then linear to min_lr_ratio over the last cooldown_frac
        cooldown = max(1, round(cfg.cooldown_frac * max_steps))
        left = min(1.0, (max_steps - step) / cooldown)
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * max(0.0, left)
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps))
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.decay == "cosine" else 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_schedule(cfg: ScheduleConfig, optimizer: torch.optim.Optimizer, max_steps: int):
    """Build the lr schedule: ``cfg``'s, except that a schedule-free optimizer only warms up."""
    import dataclasses

    import torch

    if is_schedule_free(optimizer):
        cfg = dataclasses.replace(cfg, decay="constant")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, max_steps))
