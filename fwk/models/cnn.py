"""A small CNN for tiny images (sklearn's 8x8 digits): two 3x3 convs, a pool, an MLP head."""

from __future__ import annotations

import torch
from torch import nn

from fwk.models.configs import SmallCNNConfig
from fwk.models.registry import register_model


class SmallCNN(nn.Module):
    """A small CNN that maps (B, in_channels, H, W) to (B, num_classes).

    Any H, W >= 2 works, because the pool is adaptive."""

    def __init__(
        self,
        in_channels: int,
        channels1: int,
        channels2: int,
        hidden: int,
        num_classes: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, channels1, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels1, channels2, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            # 8x8 -> 4x4; adaptive so other small sizes work too
            nn.AdaptiveMaxPool2d(4),
        )
        self.head = nn.Sequential(
            nn.Flatten(),  # (B, C2, 4, 4) -> (B, C2 * 16)
            nn.Linear(channels2 * 16, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # (B, num_classes)


@register_model(SmallCNNConfig)
def small_cnn(cfg: SmallCNNConfig) -> nn.Module:
    return SmallCNN(
        in_channels=cfg.in_channels,
        channels1=cfg.channels1,
        channels2=cfg.channels2,
        hidden=cfg.hidden,
        num_classes=cfg.num_classes,
        dropout=cfg.dropout,
    )
