"""What both plain loops of the benchmarks (plain_loop.py, plain_resnet50.py) write alike: the
warm-up + cosine schedule, the evaluation (mean loss and accuracy per target, images or
tokens), and BatchNorm statistics re-estimated before an evaluation, as a
careful user does (and as fwk's schedule-free recipes evaluate)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader


def schedule(opt: torch.optim.Optimizer, warm: int, floor: float, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warm`` steps, then a cosine to ``floor`` x the lr at ``steps``, flat after."""

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        done = min(1.0, (step - warm) / max(1, steps - warm))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


@torch.no_grad()
def recompute_bn(model: torch.nn.Module, loader: DataLoader, batches: int, device: str) -> None:
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms or not batches:
        return
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches
    model.train()
    for i, (x, _) in enumerate(loader):
        if i >= batches:
            break
        model(x.to(device))
    for m, momentum in zip(norms, saved, strict=True):
        m.momentum = momentum


@torch.no_grad()
def evaluate(model: torch.nn.Module, val: DataLoader, max_batches: int, device: str, amp: str | None) -> dict:
    model.eval()
    loss, correct, n = 0.0, 0.0, 0
    for i, (x, y) in enumerate(val):
        if max_batches and i >= max_batches:
            break
        x, y = x.to(device), y.to(device)
        with torch.autocast(device, torch.bfloat16, enabled=amp == "bf16"):
            logits = model(x)
        logits, y = logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1)
        loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        n += y.numel()
    model.train()
    return {"val_loss": loss / n, "val_acc": correct / n}
