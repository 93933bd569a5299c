"""Image models from torchvision, always built from random weights (never downloaded)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fwk.models.registry import register_model
from fwk.registry import doc


@dataclass
class ResNet50Config:
    name: str = doc("resnet50", "registry name")
    num_classes: int = doc(1000, "outputs of the final linear layer (number of classes)")
    zero_init_residual: bool = doc(
        True, "start the last BatchNorm of each residual block at zero, so each block starts as identity"
    )


@register_model(ResNet50Config)
def resnet50(cfg: ResNet50Config) -> nn.Module:
    # weights=None: random init; a pretrained checkpoint would need a download.
    import torchvision.models as tvm  # imported only by runs that use it

    return tvm.resnet50(weights=None, num_classes=cfg.num_classes, zero_init_residual=cfg.zero_init_residual)
