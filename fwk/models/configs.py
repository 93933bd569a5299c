"""Config dataclasses of the registered models: torch-free, so composing and validating a
config never imports torch. Each builder (fwk/models/<family>.py) takes its config from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from fwk.errors import UserError
from fwk.models.registry import MODELS
from fwk.registry import doc


@MODELS.register_config
@dataclass
class SmallCNNConfig:
    name: str = doc("small_cnn", "registry name")
    in_channels: int = doc(1, "channels of the input image (1 for grayscale)")
    channels1: int = doc(32, "output channels of the first 3x3 conv")
    channels2: int = doc(64, "output channels of the second 3x3 conv")
    hidden: int = doc(128, "width of the hidden layer of the head, in features")
    num_classes: int = doc(10, "number of output classes (logits per image)")
    dropout: float = doc(0.0, "dropout probability before the last linear layer (0 = off)")


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

    def check(self) -> None:
        """What the model cannot be built with, as one line before any run dir (the launcher calls it)."""
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


@MODELS.register_config
@dataclass
class ResNet50Config:
    name: str = doc("resnet50", "registry name")
    num_classes: int = doc(1000, "outputs of the final linear layer (number of classes)")
    zero_init_residual: bool = doc(
        True, "start the last BatchNorm of each residual block at zero, so each block starts as identity"
    )


@MODELS.register_config
@dataclass
class ResNet18Config:
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
