"""Models of a user's own, for `model._target_=tests.strategies.user_models.NAME`: none of
the module names a recipe was written for (no ``head.4``, ``fc``, ``lm_head``, ``tok_emb``)."""

from __future__ import annotations

import torch
from torch import nn


class UserNet(nn.Module):
    """Images (B, C, H, W) -> logits (B, num_classes): a conv, a BatchNorm and a classifier."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 8) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.body(x)).flatten(1))


class UserLM(nn.Module):
    """Tokens (B, T) -> logits (B, T, vocab): an embedding, a GRU and an output layer."""

    def __init__(self, vocab: int = 256, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.GRU(width, width, batch_first=True)
        self.out = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.embed(idx))[0])
