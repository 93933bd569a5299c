"""A data set of your own: a function, named by ``data._target_``, that returns a DataBundle.

Train the example model on two interleaved half-moons, from the folder that holds this file:

    PYTHONPATH=. fwk train data._target_=my_data.moons data.n=2000 \\
        model._target_=my_model.TinyMLP model.in_features=2 model.num_classes=2

fwk calls the function with every other ``data.*`` key as a keyword argument and with the
run's ``seed``, so the same run draws the same points. ``in_memory=True`` tells the loader
that items are cheap slices of tensors already in memory, so it loads them in the training
process instead of timing worker processes.
"""

from __future__ import annotations

import torch
from sklearn.datasets import make_moons
from torch.utils.data import TensorDataset

from fwk.data.base import DataBundle


def moons(seed: int, n: int = 2000, noise: float = 0.2, val_share: float = 0.2) -> DataBundle:
    """Draw ``n`` noisy two-moons points and split them into training and validation sets."""
    x, y = make_moons(n_samples=n, noise=noise, random_state=seed)
    x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long)
    cut = int(n * (1 - val_share))
    return DataBundle(
        train=TensorDataset(x[:cut], y[:cut]),
        val=TensorDataset(x[cut:], y[cut:]),
        task="classification",
        num_classes=2,
        in_memory=True,
    )
