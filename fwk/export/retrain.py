"""Training inside ``fwk export``: the engine retrains a pruned or fake-quantized model.

Lottery-ticket rounds, the fine-tune after one-shot pruning and quantization-aware
training all train through ``fwk.engine.trainer.train``, with the run's own config: model,
data, optimizer, schedule, precision, memory. Only the length changes, to a share of the
original steps. The learning rate may be scaled, and it runs here, in one process. The
model to train is the export's, the pruned one with the weights to start from. The engine
trains it in place of the one it would build.

Each retrain is a small run dir inside the export, ``rounds/<name>/``. Its config,
metrics and summary stay. Its checkpoints are read once for the trained weights and then
deleted, since the export keeps the final weights itself.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fwk.config.schema import one_process
from fwk.errors import UserError
from fwk.optim import peak_lr, with_lr

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fwk.config.schema import Config

logger = logging.getLogger(__name__)


def steps_for(cfg: Config, frac: float) -> int:
    """Return ``frac`` of the run's steps, at least one."""
    return max(1, round(frac * cfg.train.max_steps))


def retrain_config(cfg: Config, steps: int, lr_factor: float = 1.0) -> Config:
    """Return the run's config for one process, shortened to ``steps`` with the warm-up scaled
    alike, and with lr x ``lr_factor``."""
    replace = dataclasses.replace
    warmup = round(cfg.schedule.warmup_steps * steps / max(cfg.train.max_steps, 1))
    return replace(
        cfg,
        optim=with_lr(cfg.optim, lr * lr_factor) if (lr := peak_lr(cfg.optim)) is not None else cfg.optim,
        schedule=replace(cfg.schedule, warmup_steps=min(warmup, steps - 1)),
        train=replace(cfg.train, max_steps=steps, eval_every=0),
        checkpoint=replace(cfg.checkpoint, every=0, keep=1, rewind_at=0.0),
        methods=[m for m in cfg.methods if m != "prune_gradually"],  # the export's rounds prune; no stages on top
        # in this process: fwk export is one process (a multi-GPU retrain is not supported yet)
        parallel=one_process(cfg.parallel),
    )


def retrain(
    cfg: Config,
    model: nn.Module,
    out: Path,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Train ``model`` with ``cfg`` into run dir ``out``, and return the final weights and the
    summary."""
    from omegaconf import OmegaConf

    from fwk.components.checkpoint import model_weights
    from fwk.engine.assemble import build_run
    from fwk.engine.trainer import train
    from fwk.track.store import RunDir

    out.mkdir(parents=True)
    run = RunDir(out)
    run.config.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    lr = peak_lr(cfg.optim)
    logger.info(
        f"retraining {cfg.train.max_steps} steps (lr {'its default' if lr is None else f'{lr:g}'}) into {out.name}/"
    )
    summary = train(build_run(cfg, run, model=model))  # summary.json written
    if summary is None:  # stopped by a signal: the export's temp dir goes with it
        raise UserError("fwk export was interrupted while retraining; run the same command again to redo it")
    newest = max(run.checkpoints.iterdir(), key=lambda p: p.name)
    weights = model_weights(newest)
    shutil.rmtree(run.checkpoints)
    return weights, summary
