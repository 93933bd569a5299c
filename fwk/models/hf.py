"""Hugging Face transformers models (``model=hf``), from local files only.

``model.path`` is a folder with a ``config.json``, as ``save_pretrained`` writes it, or a
model name already in the local Hugging Face cache. Nothing is downloaded, whatever
``HF_HUB_OFFLINE`` says. ``model.config`` adds to that config, or is the whole config.
``model.task`` picks the ``AutoModelFor*`` class, and ``model.init`` picks the folder's
weights or fresh ones.

The model is wrapped so that it is called as fwk's own are. ``forward(x)`` returns the
logits, and a causal LM's ``forward(ids, targets)`` returns the mean cross-entropy through
``head_loss``, as fwk's GPT does. So the fused, chunked loss and the fp32 island of the head
apply without the (B, T, vocab) logits being kept. Its structure is the model's own: the
decoder layers are the blocks that activation checkpointing and FSDP wrap.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fwk.errors import UserError
from fwk.models.configs import HFConfig
from fwk.models.gpt import plain_head_loss
from fwk.models.registry import register_model

logger = logging.getLogger(__name__)

AUTO = {
    "causal_lm": "AutoModelForCausalLM",
    "sequence_classification": "AutoModelForSequenceClassification",
    "image_classification": "AutoModelForImageClassification",
}
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# config keys under which a model's logits are more than its head's output. Such a model's
# loss is computed from its own logits, not by head_loss on the hidden states.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def transformers() -> Any:
    try:
        import transformers as tf
    except ImportError:
        raise UserError("model=hf needs Hugging Face transformers: pip install 'fwk[hf]'") from None
    tf.utils.logging.disable_progress_bar()  # fwk prints its own lines; no bars for loading shards
    return tf


def folder(path: str, marker: str = "config.json", key: str = "model.path", instead: str = "") -> Path:
    """Return the local folder of ``path`` that holds ``marker``.

    That is ``path`` itself, or its snapshot in the Hugging Face cache. ``key`` is the setting
    that named it, and ``instead`` a fix that needs no folder at all, for the error."""
    local = Path(path).expanduser()
    if (local / marker).is_file():
        return local
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(path, marker) if not local.is_absolute() and path.count("/") <= 1 else None
    if isinstance(cached, str):
        return Path(cached).parent
    fixes = ["fetch it first (hf download NAME)", "give the folder save_pretrained wrote", *filter(None, [instead])]
    raise UserError(
        f"{key}={path}: no folder with a {marker} there, and no model of that name in the local Hugging "
        f"Face cache; fwk never downloads: {', '.join(fixes[:-1])} or {fixes[-1]}"
    )


def hf_config(cfg: HFConfig) -> tuple[Any, Path | None]:
    """Return the transformers config, and the folder it came from.

    The folder is None when the config is built from model.config."""
    tf = transformers()
    extra = dict(cfg.config)
    if not cfg.path:
        kind = extra.pop("model_type")
        try:
            return tf.AutoConfig.for_model(kind, **extra), None
        except ValueError as exc:
            raise UserError(f"model.config.model_type={kind}: {exc}".splitlines()[0]) from None
    where = folder(cfg.path)
    try:
        return tf.AutoConfig.from_pretrained(where, local_files_only=True, **extra), where
    except (OSError, ValueError) as exc:
        raise UserError(f"model.path={cfg.path}: cannot read its config.json: {str(exc).splitlines()[0]}") from None


class HFModel(nn.Module):
    """A transformers model called as fwk's models are: ``forward(x)`` returns the logits."""

    def __init__(self, hf: nn.Module, task: str) -> None:
        super().__init__()
        self.hf = hf
        self.task = task

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.task == "image_classification":
            return self.hf(pixel_values=x).logits
        return self.hf(input_ids=x).logits


class HFCausalLM(HFModel):
    """A causal LM whose ``forward(ids)`` returns the logits (B, T, vocab).

    With ``targets``, it returns the mean cross-entropy of the head on the final hidden states.
    ``head_loss`` computes it, and it can be swapped."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__(hf, "causal_lm")
        head = hf.get_output_embeddings()
        names = {id(m): n for n, m in self.named_modules()}
        plain = isinstance(head, nn.Linear) and head.bias is None
        plain = plain and not any(getattr(hf.config, k, None) for k in LOGIT_TRANSFORMS)
        self.head_loss = plain_head_loss
        self.head_of = names[id(head)] if plain else None  # None: the loss comes from the model's logits

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, label_smoothing: float = 0.0):
        if targets is None:
            return self.hf(input_ids=idx).logits
        if self.head_of is None:
            logits = self.hf(input_ids=idx).logits
            return nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), targets.flatten(), label_smoothing=label_smoothing
            )
        hidden = self.hf.base_model(input_ids=idx).last_hidden_state
        head = self.hf.get_output_embeddings()
        return self.head_loss(hidden.flatten(0, 1), head.weight, targets.flatten(), label_smoothing)


@register_model(HFConfig)
def hf(cfg: HFConfig) -> nn.Module:
    tf = transformers()
    config, where = hf_config(cfg)
    auto = getattr(tf, AUTO[cfg.task])
    try:
        if cfg.init == "pretrained":
            assert where is not None  # HFConfig.check: pretrained needs a path
            if not any((where / w).is_file() for w in WEIGHTS):
                raise UserError(
                    f"model.path={cfg.path} holds no weights ({' or '.join(WEIGHTS[::2])}); "
                    "train from its config with model.init=scratch"
                )
            model = auto.from_pretrained(where, config=config, local_files_only=True, dtype=torch.float32)
        else:
            model = auto.from_config(config, dtype=torch.float32)
    except ValueError as exc:  # a config the task's Auto class has no model for
        raise UserError(f"model.task={cfg.task}: {str(exc).splitlines()[0]}") from None
    model.config.use_cache = False  # training: no key/value cache
    return HFCausalLM(model) if cfg.task == "causal_lm" else HFModel(model, cfg.task)
