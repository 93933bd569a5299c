"""Random images and labels, for benchmarking image models without a data set on disk.

Each item is generated on demand from a generator seeded by the seed, the split and the
index. So the set is deterministic and costs no memory, whatever num_train is.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from fwk.data.base import DataBundle, item_seed
from fwk.data.configs import SyntheticConfig
from fwk.data.registry import register_data

_TRAIN, _VAL = 0, 1  # stream ids, so that val item i is not train item i


class RandomImages(Dataset):
    """Random (image, label) items, each image a float32 (3, S, S) ~ ``N(0, 1)``, like a normalized photo."""

    def __init__(self, length: int, image_size: int, num_classes: int, *, seed: int, stream: int) -> None:
        self.length = length
        self.image_size = image_size
        self.num_classes = num_classes
        self.seed = seed
        self.stream = stream

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} items")
        gen = torch.Generator().manual_seed(item_seed(self.seed, self.stream, index))
        size = self.image_size
        image = torch.randn(3, size, size, generator=gen)  # (C, H, W)
        label = int(torch.randint(self.num_classes, (), generator=gen))
        return image, label


@register_data(SyntheticConfig)
def synthetic(cfg: SyntheticConfig, *, seed: int) -> DataBundle:
    def split(length: int, stream: int) -> RandomImages:
        return RandomImages(length, cfg.image_size, cfg.num_classes, seed=seed, stream=stream)

    return DataBundle(
        train=split(cfg.num_train, _TRAIN),
        val=split(cfg.num_val, _VAL),
        task="classification",
        num_classes=cfg.num_classes,
    )
