"""The builder of the data set a config names: a registered one, or the user's own by ``_target_``."""

from __future__ import annotations

from typing import Any

import torch

from fwk.config.instantiate import instantiate
from fwk.data.base import DataBundle
from fwk.data.registry import DATA
from fwk.errors import UserError


def build_data(cfg: Any, seed: int) -> DataBundle:
    """Build a registered data set, or the ``_target_``, a callable that returns a DataBundle.

    The seed is passed in."""
    if isinstance(cfg, dict):
        bundle = instantiate(cfg, seed=seed)
        if not isinstance(bundle, DataBundle):
            raise UserError(
                f"data._target_={cfg['_target_']} must return fwk.data.DataBundle, got {type(bundle).__name__}"
            )
        return bundle
    return DATA.get(cfg.name).builder(cfg, seed=seed)


def example_input(data: DataBundle) -> torch.Tensor:
    """Return one validation input as a batch of one, as the model takes it.

    Images come as floats, and token ids as int64. A method that traces the model runs it on
    this input."""
    x = data.val[0][0]
    x = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    ids = data.task == "lm" or x.dtype == torch.int64  # a text classifier's input is token ids too
    return (x if ids or x.is_floating_point() else x.float()).unsqueeze(0)
