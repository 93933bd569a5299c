"""What every dataset builder returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch.utils.data import Dataset

from fwk.registry import Registry

DATA = Registry("data")
register_data = DATA.register


@dataclass
class DataBundle:
    """Train and validation sets plus what the engine needs to know about the task.

    ``task`` picks the metric: "classification" reports accuracy, "lm" reports loss and
    perplexity per token. ``num_classes`` is the number of classes, or the vocabulary
    size for "lm"; the engine checks it against the model's output size.
    Datasets whose items are random (augmentation) may define ``set_epoch(epoch)``: the
    engine calls it before each epoch so that item ``i`` of epoch ``e`` is the same
    whatever the number of loader workers, and a resumed run sees the same items.
    """

    train: Dataset
    val: Dataset
    task: Literal["classification", "lm"]
    num_classes: int
