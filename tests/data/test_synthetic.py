"""synthetic: shapes, label range, determinism from (seed, index)."""

from __future__ import annotations

import pytest
import torch

from fwk.data.synthetic import SyntheticConfig, synthetic


def build(seed=0):
    cfg = SyntheticConfig(num_train=10, num_val=4, image_size=16, num_classes=5)
    return synthetic(cfg, seed=seed)


def test_shapes_and_labels():
    bundle = build()
    assert bundle.task == "classification" and bundle.num_classes == 5
    assert len(bundle.train) == 10 and len(bundle.val) == 4
    image, label = bundle.train[3]
    assert image.shape == (3, 16, 16) and image.dtype == torch.float32
    assert all(0 <= bundle.train[i][1] < 5 for i in range(10))
    with pytest.raises(IndexError):
        bundle.train[10]


def test_deterministic_from_seed_and_index():
    a, b = build(), build()
    for i in (0, 9):
        assert torch.equal(a.train[i][0], b.train[i][0]) and a.train[i][1] == b.train[i][1]
    assert not torch.equal(a.train[0][0], a.train[1][0])
    assert not torch.equal(a.train[0][0], a.val[0][0])  # val is another stream
    assert not torch.equal(a.train[0][0], build(seed=1).train[0][0])


def test_defaults_are_imagenet_sized():
    cfg = SyntheticConfig()
    assert (cfg.name, cfg.image_size, cfg.num_classes) == ("synthetic", 224, 1000)
    image, label = synthetic(cfg, seed=0).train[0]
    assert image.shape == (3, 224, 224) and 0 <= label < 1000
