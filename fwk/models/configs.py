"""The config dataclasses of the registered models, which are torch-free.

Composing and validating a config never imports torch. Each builder (fwk/models/<family>.py)
takes its config from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.errors import UserError
from fwk.models.registry import MODELS
from fwk.registry import doc


def init_from_field() -> Any:
    """Return the ``model.init_from`` field of every registered model, which fwk/models/weights.py loads."""
    return doc(
        None,
        "start from these weights (fine-tuning): a .safetensors file (fwk export --format safetensors) or a folder "
        "save_pretrained wrote (fwk export --format hf); their names and shapes must be the model's",
    )


class StartsFrom:
    """A model config whose only check is its ``init_from``.

    A config with more checks calls ``check_init_from`` itself."""

    init_from: str | None

    def check(self) -> None:
        check_init_from(self.init_from)


def check_init_from(where: str | None) -> None:
    """Refuse a ``model.init_from`` that is not there, or whose safetensors cannot be parsed, before
    any run dir exists. Only their headers are read: the launcher never loads the tensors."""
    if not where:
        return
    path = Path(where).expanduser()
    if not path.exists():
        raise UserError(
            f"model.init_from={where} does not exist: give a .safetensors file or a folder save_pretrained wrote"
        )
    from safetensors import SafetensorError, safe_open

    for file in weight_files(path):
        try:
            with safe_open(str(file), framework="numpy"):  # numpy: the launcher imports no torch
                pass
        except SafetensorError as exc:
            raise unreadable(where, file, exc) from None


def weight_files(where: Path) -> list[Path]:
    """Return the safetensors files of ``model.init_from``: the file itself, a folder's
    model.safetensors, or the shards its index lists (fwk/models/weights.py loads them)."""
    if where.is_file():
        return [where]
    if (where / "model.safetensors").is_file():
        return [where / "model.safetensors"]
    index = where / "model.safetensors.index.json"
    if index.is_file():
        import json

        return [where / shard for shard in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    raise UserError(f"model.init_from={where} holds no model.safetensors (nor a sharded index of them)")


def unreadable(given: str, file: Path, exc: Exception) -> UserError:
    """Return the error for a weights file safetensors cannot parse: its header is damaged, the file
    was cut short (a copy or a download that stopped), or it is no safetensors file at all."""
    with open(file, "rb") as f:
        archive = f.read(4) == b"PK\x03\x04"  # torch.save writes a zip archive
    what = "it is a torch.save archive; fwk loads only safetensors" if archive else "damaged or truncated"
    where = f"{given}: {file}" if Path(given).expanduser() != file else given
    return UserError(
        f"model.init_from={where} is not a readable safetensors file ({what}: {str(exc).splitlines()[0]}); "
        "point model.init_from at a valid .safetensors file or a folder save_pretrained wrote, "
        "or remove model.init_from"
    )


@MODELS.register_config
@dataclass
class SmallCNNConfig(StartsFrom):
    name: str = doc("small_cnn", "registry name")
    in_channels: int = doc(1, "channels of the input image (1 for grayscale)")
    channels1: int = doc(32, "output channels of the first 3x3 conv")
    channels2: int = doc(64, "output channels of the second 3x3 conv")
    hidden: int = doc(128, "width of the hidden layer of the head, in features")
    num_classes: int = doc(10, "number of output classes (logits per image)")
    dropout: float = doc(0.0, "dropout probability before the last linear layer (0 = off)")
    init_from: str | None = init_from_field()


@MODELS.register_config
@dataclass
class GPTConfig:
    name: str = doc("gpt", "registry name")
    vocab_size: int = doc(256, "number of token ids (256 for bytes)")
    block_size: int = doc(128, "longest context the model accepts, in tokens (size of the position table)")
    n_layer: int = doc(4, "number of transformer blocks")
    n_head: int = doc(4, "attention heads per block; must divide n_embd")
    n_embd: int = doc(192, "width of the residual stream, in features")
    dropout: float = doc(0.0, "dropout probability on embeddings, attention and residual branches (0 = off)")
    bias: bool = doc(False, "use bias in Linear and LayerNorm layers (False is a little faster and as good)")
    init_from: str | None = init_from_field()

    def check(self) -> None:
        """Refuse what the model cannot be built with, as one line before any run dir.

        The launcher calls it."""
        sizes = {"vocab_size": self.vocab_size, "block_size": self.block_size, "n_layer": self.n_layer}
        for key, value in {**sizes, "n_head": self.n_head, "n_embd": self.n_embd}.items():
            if value < 1:
                raise UserError(f"model.{key}={value} is not allowed: expected an integer >= 1")
        if self.n_embd % self.n_head:
            near = max(self.n_head, round(self.n_embd / self.n_head) * self.n_head)
            raise UserError(
                f"model.n_embd={self.n_embd} must be divisible by model.n_head={self.n_head} (each head gets "
                f"n_embd / n_head features); use model.n_embd={near}, or a model.n_head that divides {self.n_embd}"
            )
        if not 0 <= self.dropout < 1:
            raise UserError(f"model.dropout={self.dropout} is not allowed: expected a probability in [0, 1)")
        check_init_from(self.init_from)

    def check_layout(self, dims: Any, stages_per_rank: int) -> Iterator[tuple[bool, str, Any, str]]:
        """Yield what tensor and pipeline parallel need of this GPT (``fwk/models/gpt_parallel.py``)."""
        divisors = [d for d in range(1, self.n_head + 1) if self.n_head % d == 0]
        yield (
            self.n_head % dims.tp == 0,
            "parallel.tp",
            dims.tp,
            f"a divisor of model.n_head={self.n_head} ({', '.join(map(str, divisors))}): "
            "each rank computes whole heads",
        )
        stages = dims.pp * stages_per_rank
        yield (
            stages <= self.n_layer,
            "parallel.pp",
            dims.pp,
            f"at most model.n_layer={self.n_layer} stages in all (pp x pp_stages_per_rank = {stages}): "
            "each stage needs a block",
        )


@MODELS.register_config
@dataclass
class ResNet50Config(StartsFrom):
    name: str = doc("resnet50", "registry name")
    num_classes: int = doc(1000, "outputs of the final linear layer (number of classes)")
    zero_init_residual: bool = doc(
        True, "start the last BatchNorm of each residual block at zero, so each block starts as identity"
    )
    init_from: str | None = init_from_field()


@MODELS.register_config
@dataclass
class ResNet18Config(StartsFrom):
    name: str = doc("resnet18", "registry name")
    num_classes: int = doc(1000, "outputs of the final linear layer (number of classes)")
    in_channels: int = doc(3, "channels of the input image (1 for grayscale)")
    small_input: bool = doc(
        False,
        "for images of ~32 px: a 3x3 stride-1 stem conv and no max-pool (the CIFAR variant); "
        "false = torchvision's 7x7 stride-2 stem and max-pool, which leave 1x1 maps at 32 px",
    )
    zero_init_residual: bool = doc(
        False, "start the last BatchNorm of each residual block at zero, so each block starts as identity"
    )
    init_from: str | None = init_from_field()


HF_TASKS = ("causal_lm", "sequence_classification", "image_classification")  # AutoModelFor* heads
HF_INITS = ("pretrained", "scratch")


@MODELS.register_config
@dataclass
class HFConfig:
    name: str = doc("hf", "registry name")
    path: str | None = doc(
        None,
        "a local folder holding a config.json (weights optional), or a model name already in the local Hugging "
        "Face cache; nothing is ever downloaded. Empty: the model is built from model.config alone",
    )
    task: str = doc("causal_lm", f"which AutoModelFor* head: {', '.join(HF_TASKS)}")
    init: str = doc("pretrained", "pretrained: the folder's weights; scratch: its config with fresh weights")
    config: dict[str, Any] = doc(
        {},
        "transformers config keys: on top of the folder's config.json, or (no path) the whole config with its "
        "model_type, e.g. {model_type: llama, hidden_size: 128, num_hidden_layers: 2}",
    )
    init_from: str | None = init_from_field()

    def check(self) -> None:
        """Refuse what cannot work, as one line before any run dir, importing no torch and no transformers."""
        if self.task not in HF_TASKS:
            raise UserError(f"model.task={self.task} is not one of {', '.join(HF_TASKS)}")
        if self.init not in HF_INITS:
            raise UserError(f"model.init={self.init} is not one of {', '.join(HF_INITS)}")
        if not self.path:
            if "model_type" not in self.config:
                raise UserError(
                    "model=hf needs model.path=DIR (a folder with a config.json) or model.config with a model_type, "
                    "e.g. model.config.model_type=llama"
                )
            if self.init == "pretrained":
                raise UserError("model.init=pretrained needs model.path (a folder with weights); or model.init=scratch")
            return check_init_from(self.init_from)
        check_init_from(self.init_from)
        folder = Path(self.path).expanduser()
        local = folder.exists() or self.path.startswith((".", "/", "~")) or self.path.count("/") > 1
        if local and not (folder / "config.json").is_file():
            what = "does not exist" if not folder.exists() else "has no config.json"
            raise UserError(
                f"model.path={self.path} {what}: give a folder holding a Hugging Face config.json "
                "(what save_pretrained writes)"
            )

    def check_layout(self, dims: Any, stages_per_rank: int) -> Iterator[tuple[bool, str, Any, str]]:
        """Yield what tensor parallel needs of this model, which it gets by the model's own plan.

        The plan is in ``fwk/models/hf_parallel.py``. There is no pipeline split yet."""
        yield (
            dims.pp == 1,
            "parallel.pp",
            dims.pp,
            "1 with model=hf (fwk does not cut Hugging Face models into pipeline stages yet); use tp, fsdp or ddp",
        )
        for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            value = self.config.get(key)
            yield (
                not isinstance(value, int) or value % dims.tp == 0,
                "parallel.tp",
                dims.tp,
                f"a divisor of model.config.{key}={value} (each rank holds {key} / tp)",
            )

    def output_key(self, task: str) -> str:
        """Return the key that sets the model's output size: its vocabulary, or its number of labels."""
        return "model.config.vocab_size" if task == "lm" else "model.config.num_labels"
