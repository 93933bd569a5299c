"""scikit-learn's 8x8 handwritten digits (1,797 images, 10 classes): a seconds-long CPU task."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import TensorDataset

from fwk.data.base import DataBundle, register_data
from fwk.errors import UserError
from fwk.registry import doc


@dataclass
class DigitsConfig:
    name: str = doc("digits", "registry name")
    val_size: int = doc(300, "number of images held out for validation")
    split_seed: int = doc(0, "seed of the train/val split; independent of the run's seed so the val set is fixed")
    normalize: bool = doc(True, "subtract the train pixels' mean and divide by their std (one scalar each)")


@register_data(DigitsConfig)
def digits(cfg: DigitsConfig, *, seed: int) -> DataBundle:
    """``seed`` (the run's seed) is deliberately unused: the split depends on ``split_seed``
    only, so changing the run's seed never changes the validation set."""
    del seed
    # imported here: only this dataset needs sklearn, and it is slow to import
    from sklearn.datasets import load_digits

    raw = load_digits()
    images = torch.as_tensor(raw.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
    labels = torch.as_tensor(raw.target, dtype=torch.int64)  # (N,)
    n = len(labels)
    if not 0 < cfg.val_size < n:
        raise UserError(f"data.val_size={cfg.val_size} must be between 1 and {n - 1} (digits has {n} images)")

    perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.split_seed))
    val_idx, train_idx = perm[: cfg.val_size], perm[cfg.val_size :]
    x_train, x_val = images[train_idx], images[val_idx]
    if cfg.normalize:
        # Statistics of the training images only, so nothing leaks from val.
        mean, std = x_train.mean(), x_train.std()
        x_train, x_val = (x_train - mean) / std, (x_val - mean) / std

    return DataBundle(
        train=TensorDataset(x_train, labels[train_idx]),
        val=TensorDataset(x_val, labels[val_idx]),
        task="classification",
        num_classes=10,
    )
