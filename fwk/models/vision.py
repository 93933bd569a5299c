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


@register_model(ResNet18Config)
def resnet18(cfg: ResNet18Config) -> nn.Module:
    import torchvision.models as tvm

    model = tvm.resnet18(weights=None, num_classes=cfg.num_classes, zero_init_residual=cfg.zero_init_residual)
    if cfg.small_input:
        # (B, C, 32, 32) -> (B, 64, 32, 32): the four stages then run at 32, 16, 8, 4 px
        model.conv1 = nn.Conv2d(cfg.in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # torchvision's init
        model.maxpool = nn.Identity()
    elif cfg.in_channels != 3:
        model.conv1 = nn.Conv2d(cfg.in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model
