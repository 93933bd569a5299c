"""Tensor parallelism: each layer's matrices split over the ``tp`` slice of the mesh.

The model family brings its plan, beside the model: ``torch.distributed.tensor.parallel``
styles keyed by module names. fwk's GPT has one (``fwk/models/gpt_parallel.py``), a Hugging
Face model brings its config's ``base_model_tp_plan`` (``fwk/models/hf_parallel.py``), and a
user's model a ``tp_plan()`` method it defines. Convolutional models have none: their
channels gain nothing from it, and they are refused in one line.

``parallelize.py`` applies it after the pipeline split and before activation checkpointing
and data parallelism. A plan key that matches nothing only warns in torch, so every
parameter the plan names is checked to have become a DTensor.
"""

from __future__ import annotations

import logging

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from fwk.distributed.collectives import grads_laid_out_as_params
from fwk.errors import UserError

logger = logging.getLogger(__name__)


def apply(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard ``model`` in place over ``tp_mesh`` by its family's plan, or refuse it in one line."""
    degree = tp_mesh.size()
    hf_config = getattr(getattr(model, "hf", model), "config", None)  # fwk's wrapper of a transformers model
    if hasattr(model, "tp_plan"):
        plan = model.tp_plan(degree)
        parallelize_module(model, tp_mesh, plan)
        after = getattr(model, "after_tp", None)
        if after is not None:  # what the plan cannot say: tied weights, local head counts
            after(degree)
        _check_sharded(model, list(plan))
        grads_laid_out_as_params(model)
    elif hf_config is not None and hasattr(hf_config, "base_model_tp_plan"):
        from fwk.models.hf_parallel import tensor_parallel

        tensor_parallel(model, tp_mesh)
    else:
        raise UserError(
            f"parallel.tp={degree}: the model {type(model).__name__} has no tensor-parallel plan (fwk's GPT, "
            "Hugging Face models with a base_model_tp_plan, or a model with a tp_plan(degree) method that returns "
            "torch.distributed.tensor.parallel styles by module name); use parallel.tp=1 with fsdp or pp"
        )
    sharded = sum(isinstance(p, DTensor) for p in model.parameters())
    logger.info(f"tensor parallel: {degree} ranks, {sharded} of {len(list(model.parameters()))} parameters sharded")


def _check_sharded(model: nn.Module, patterns: list[str]) -> None:
    import fnmatch

    for pattern in patterns:
        hits = [n for n, _ in model.named_modules() if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise UserError(f"tensor-parallel plan key '{pattern}' matches no module of {type(model).__name__}")
        for name in hits:
            plain = [n for n, p in model.get_submodule(name).named_parameters() if not isinstance(p, DTensor)]
            assert not plain, f"tensor-parallel plan left {name}.{plain[0]} whole"
