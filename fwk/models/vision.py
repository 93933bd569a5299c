"""Image models from torchvision, always built from random weights (never downloaded)."""

from __future__ import annotations

from torch import nn

from fwk.models.configs import ResNet18Config, ResNet50Config
from fwk.models.registry import register_model


@register_model(ResNet50Config)
def resnet50(cfg: ResNet50Config) -> nn.Module:
    # weights=None: random init; a pretrained checkpoint would need a download.
    import torchvision.models as tvm  # imported only by runs that use it

    return tvm.resnet50(weights=None, num_classes=cfg.num_classes, zero_init_residual=cfg.zero_init_residual)


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
