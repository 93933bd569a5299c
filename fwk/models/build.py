"""The model build: the model a config names, a registered one or the user's own by ``_target_``.

The built model is checked against the data it will train on."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fwk.config.instantiate import instantiate, model_arguments
from fwk.data.base import DataBundle
from fwk.errors import UserError
from fwk.models.registry import MODELS

logger = logging.getLogger(__name__)


def _output_size(model: nn.Module, data: DataBundle) -> int:
    x, _ = data.train[0]
    model.eval()
    with torch.no_grad():
        out = model(x.unsqueeze(0))
    model.train()
    return int(out.shape[-1])


def build_model(cfg: Any, data: DataBundle, init: bool = True) -> nn.Module:
    """Build a registered model or a ``_target_`` class.

    Its output size must match the data's classes. Keys a ``_target_`` class does not take are
    left out, with a line (see ``model_arguments``). ``init`` starts the model from
    ``model.init_from``'s weights where that is set. It is False where a checkpoint's weights
    replace them, as in a resumed run or an export, so the file need not be there any more."""
    init_from = cfg.get("init_from") if isinstance(cfg, dict) else getattr(cfg, "init_from", None)
    if isinstance(cfg, dict):
        cfg, dropped = model_arguments(cfg)
        if dropped:
            logger.info(
                f"model: {cfg['_target_']} takes no {', '.join(dropped)} (the recipe's settings for its own "
                "model): left out"
            )
    model = instantiate(cfg) if isinstance(cfg, dict) else MODELS.get(cfg.name).builder(cfg)
    if not isinstance(model, nn.Module):
        raise UserError(f"model._target_ must build a torch.nn.Module, got {type(model).__name__}")
    expected = data.num_classes
    declared = getattr(cfg, "num_classes", None) or getattr(cfg, "vocab_size", None)
    size = declared if declared is not None else _output_size(model, data)
    if size != expected and not (data.task == "lm" and size > expected):  # a vocabulary padded past the tokenizer's
        key = "model.vocab_size" if hasattr(cfg, "vocab_size") else "model.num_classes"
        key = cfg.output_key(data.task) if hasattr(cfg, "output_key") else key  # a config whose size lives elsewhere
        raise UserError(f"{key}={size} but the data has {expected} classes; set {key}={expected}")
    if init and init_from:  # fine-tuning: saved weights, checked against the model's
        from fwk.models.weights import load_weights

        load_weights(model, Path(init_from).expanduser(), init_from)
    return model
