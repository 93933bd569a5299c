"""A model of your own: any ``nn.Module`` class, named by ``model._target_``.

Train it on the default recipe's digits, from the folder that holds this file:

    fwk train model._target_=my_model.TinyMLP model.hidden=64

fwk imports the class and passes every other ``model.*`` key to it as a keyword argument.
The engine checks that the model's output has ``data``'s number of classes, so
``num_classes`` keeps its default here. Images arrive as (B, C, H, W) tensors; this model
flattens them, so it also takes any data set of flat vectors.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyMLP(nn.Module):
    """Map inputs of any shape to class logits with two linear layers."""

    def __init__(self, in_features: int = 64, hidden: int = 32, num_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))  # (B, ...) -> (B, in_features) -> (B, classes)
