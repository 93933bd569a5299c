"""scikit-learn's 8x8 handwritten digits, 1,797 images of 10 classes: a seconds-long CPU task."""

from __future__ import annotations

import gzip

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from fwk.data.base import DataBundle
from fwk.data.configs import DigitsConfig
from fwk.data.registry import register_data
from fwk.data.sources import digits_file
from fwk.errors import UserError


@register_data(DigitsConfig)
def digits(cfg: DigitsConfig, *, seed: int) -> DataBundle:
    """Build the digits data set, split by ``split_seed``.

    ``seed``, the run's seed, is deliberately unused. The split depends on ``split_seed`` only,
    so changing the run's seed never changes the validation set."""
    del seed
    # scikit-learn's file read as its load_digits reads it (64 pixels in 0-16, then the label,
    # per row), without importing scikit-learn: ~2 s of scipy and pandas in every process
    with gzip.open(digits_file(), mode="rt", encoding="utf-8") as f:
        raw = np.loadtxt(f, delimiter=",")  # (N, 65)
    images = torch.as_tensor(raw[:, :-1], dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0  # (N, 1, 8, 8) in [0, 1]
    labels = torch.as_tensor(raw[:, -1].astype(np.int64))  # (N,)
    n = len(labels)
    if cfg.image_size < 8:
        raise UserError(f"data.image_size={cfg.image_size} must be >= 8 (the digits are 8x8; larger sizes upscale)")
    if cfg.image_size != 8:
        # (N, 1, 8, 8) -> (N, 1, S, S), once, before the split: a ResNet's stages need room to downsample
        images = F.interpolate(images, size=cfg.image_size, mode="bilinear", align_corners=False)
    if not 0 < cfg.val_size < n:
        raise UserError(f"data.val_size={cfg.val_size} must be between 1 and {n - 1} (digits has {n} images)")

    perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.split_seed))
    val_idx, train_idx = perm[: cfg.val_size], perm[cfg.val_size :]
    x_train, x_val = images[train_idx], images[val_idx]
    stats = None
    if cfg.normalize:
        # Statistics of the training images only, so nothing leaks from val.
        mean, std = x_train.mean(), x_train.std()
        x_train, x_val = (x_train - mean) / std, (x_val - mean) / std
        stats = (float(mean),), (float(std),)

    return DataBundle(
        train=TensorDataset(x_train, labels[train_idx]),
        val=TensorDataset(x_val, labels[val_idx]),
        task="classification",
        num_classes=10,
        mean=stats[0] if stats else None,
        std=stats[1] if stats else None,
        in_memory=True,
    )
