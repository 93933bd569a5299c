"""``model.init_from``: start any registered model from saved weights, for fine-tuning.

The weights are a ``.safetensors`` file, as ``fwk export --format safetensors`` writes it, or
a folder ``save_pretrained`` wrote, sharded or not. Such a folder comes from
``fwk export --format hf``, or it is any Hugging Face model folder. Their names and shapes are
checked against the model's before anything is loaded, and a mismatch is one line.
``fwk/models/build.py`` loads them once the model is built.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fwk.errors import UserError


def tensors_of(where: Path, given: str | None = None) -> dict[str, torch.Tensor]:
    """Return every tensor of a .safetensors file, or of the safetensors of a folder, sharded or not.

    ``given`` is ``model.init_from`` as the user wrote it, for the error."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from fwk.models.configs import unreadable, weight_files

    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(where):
        try:  # the launcher read the headers; a worker's copy can still be another (replaced since, or cut short)
            tensors.update(load_file(file))
        except SafetensorError as exc:
            raise unreadable(given or str(where), file, exc) from None
    return tensors


def named_as(tensors: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Return ``tensors`` under the model's names.

    A model that wraps another under one attribute takes the inner model's names too. For
    model=hf that attribute is ``hf.``, around the transformers model."""
    heads = {k.split(".", 1)[0] for k in own}
    if len(heads) == 1 and tensors and not any(k in own for k in tensors):
        return {f"{next(iter(heads))}.{k}": v for k, v in tensors.items()}
    return tensors


def load_weights(model: nn.Module, where: Path, given: str) -> None:
    """Load ``where``'s tensors into ``model``.

    Their names and shapes are first checked to be the model's. A tied weight stored once
    (save_pretrained, safetensors' ``save_model``) is found through the tensor it shares."""
    own = model.state_dict()
    tensors = named_as(tensors_of(where, given), own)
    same: dict[int, list[str]] = {}  # a tied parameter's names (the input embedding and the LM head)
    for name, param in model.named_parameters(remove_duplicate=False):
        same.setdefault(id(param), []).append(name)
    stored = {n for names in same.values() if any(m in tensors for m in names) for n in names}
    missing = [k for k in own if k not in tensors and k not in stored]
    unexpected = [k for k in tensors if k not in own]
    wrong = [
        f"{k} {tuple(tensors[k].shape)} vs {tuple(own[k].shape)}"
        for k in tensors
        if k in own and tensors[k].shape != own[k].shape
    ]
    if missing or unexpected or wrong:
        parts = [f"{len(missing)} of the model's weights missing (e.g. {missing[0]})"] if missing else []
        parts += [f"{len(unexpected)} not in the model (e.g. {unexpected[0]})"] if unexpected else []
        parts += [f"{len(wrong)} of another shape (e.g. {wrong[0]})"] if wrong else []
        raise UserError(f"model.init_from={given} does not fit the model: {'; '.join(parts)}")
    model.load_state_dict(tensors, strict=False)
