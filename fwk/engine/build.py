"""Config sections -> objects: registry builders, or the user's own class by ``_target_``."""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fwk.config.asks import asks
from fwk.data import DATA, DataBundle
from fwk.errors import UserError
from fwk.models import MODELS
from fwk.optim import build_optimizer

logger = logging.getLogger(__name__)


def _instantiate(section: dict[str, Any], **kwargs: Any) -> Any:
    from hydra.utils import instantiate

    try:
        return instantiate(section, **kwargs)
    except Exception as exc:  # the user's class failed to import or construct
        cause = exc.__cause__ or exc
        raise UserError(f"cannot build {section['_target_']}: {type(cause).__name__}: {cause}") from None


def build_data(cfg: Any, seed: int) -> DataBundle:
    """A registered data set, or ``_target_``: a callable returning a DataBundle (seed passed in)."""
    if isinstance(cfg, dict):
        bundle = _instantiate(cfg, seed=seed)
        if not isinstance(bundle, DataBundle):
            raise UserError(
                f"data._target_={cfg['_target_']} must return fwk.data.DataBundle, got {type(bundle).__name__}"
            )
        return bundle
    return DATA.get(cfg.name).builder(cfg, seed=seed)


def _output_size(model: nn.Module, data: DataBundle) -> int:
    x, _ = data.train[0]
    model.eval()
    with torch.no_grad():
        out = model(x.unsqueeze(0))
    model.train()
    return int(out.shape[-1])


def model_arguments(section: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A ``_target_`` model section without the keys its class does not take, and those keys.

    A recipe sets keys for its own model (``model.num_classes``, ``model.n_layer``); with the
    user's ``model._target_`` they reach the user's class too. Those it does not take are
    left out, so a recipe works with any model; a key the user typed is checked in ``preflight``.
    """
    import inspect

    from hydra.utils import get_object

    section = {k: v for k, v in section.items() if k != "init_from"}  # fwk's: loaded by build_model
    target = section["_target_"]
    try:
        signature = inspect.signature(get_object(target))
    except Exception:  # noqa: BLE001 - not importable or no signature: _instantiate says what is wrong
        return section, []
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return section, []
    takes = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    dropped = [k for k in section if not k.startswith("_") and k not in takes]
    return {k: v for k, v in section.items() if k not in dropped}, dropped


def build_model(cfg: Any, data: DataBundle, init: bool = True) -> nn.Module:
    """A registered model or ``_target_`` class; its output size must match the data's classes.
    Keys a ``_target_`` class does not take are left out, with a line (see ``model_arguments``).
    ``init``: start from ``model.init_from``'s weights where set; False where a checkpoint's
    replace them (a resumed run, an export), so the file need not be there any more."""
    init_from = cfg.get("init_from") if isinstance(cfg, dict) else getattr(cfg, "init_from", None)
    if isinstance(cfg, dict):
        cfg, dropped = model_arguments(cfg)
        if dropped:
            logger.info(
                f"model: {cfg['_target_']} takes no {', '.join(dropped)} (the recipe's settings for its own "
                "model): left out"
            )
    model = _instantiate(cfg) if isinstance(cfg, dict) else MODELS.get(cfg.name).builder(cfg)
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


def preflight(cfg: Any, typed: Collection[str] = ()) -> list[str]:
    """Checks that need the model or the device, run before any run dir exists: the module
    patterns of precision and memory that the user typed (``typed``: the keys of the
    command's overrides) match, a ``_target_`` model and optimizer take the settings given,
    the device runs the asked format and kernels. Returns the
    lines to say before the run starts: an asked format that is slow on this device.

    The model is built on the meta device: its structure without allocating its weights.
    """
    from fwk.strategies import hardware, kernels, memory, precision

    asked = asks(cfg, typed)
    if asked.arguments:
        section, dropped = model_arguments(cfg.model)
        typed_here = [k for k in dropped if f"model.{k}" in typed]
        if typed_here:
            raise UserError(
                f"model.{typed_here[0]}: {section['_target_']} takes no argument '{typed_here[0]}'; "
                "give only the arguments of its __init__"
            )
    if asked.optimizer:  # a class of your own: built once on a small layer, so a wrong setting is one line now
        build_optimizer(cfg.optim, nn.Linear(2, 2))
    cuda = cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    kernels.check_available(cfg.kernels, device)
    slow = hardware.slow_here(asked.format, hardware.probe(device), device) if asked.format else None
    notes = [f"precision={cfg.precision.name} is slow here: {slow}"] if slow else []
    if not asked.meta:
        return notes
    with torch.device("meta"):
        model = (
            _instantiate(model_arguments(cfg.model)[0])
            if isinstance(cfg.model, dict)
            else MODELS.get(cfg.model.name).builder(cfg.model)
        )
    precision.check_model(cfg.precision, model, device, typed)
    memory.check_model(cfg.memory, model, typed)
    if asked.muon:
        from fwk.optim.muon import check_model as check_muon

        check_muon(model)
    return notes


def example_input(data: DataBundle) -> torch.Tensor:
    """One validation input as a batch of one, as the model takes it (images as floats, token
    ids as int64): what a method that traces the model runs it on."""
    x = data.val[0][0]
    x = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    ids = data.task == "lm" or x.dtype == torch.int64  # a text classifier's input is token ids too
    return (x if ids or x.is_floating_point() else x.float()).unsqueeze(0)
