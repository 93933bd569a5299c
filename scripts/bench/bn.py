"""BatchNorm statistics re-estimated before an evaluation, as a careful user of a plain loop
does (and as fwk's schedule-free recipes evaluate): both plain loops of the benchmarks."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader


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
