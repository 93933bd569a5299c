"""resnet50: builds from config without downloads, output size follows num_classes."""

from __future__ import annotations

import torch

from fwk.models.vision import ResNet50Config, resnet50


def test_forward_shape():
    torch.manual_seed(0)
    model = resnet50(ResNet50Config(num_classes=7))
    out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 7)


def test_zero_init_residual_passed_through():
    on = resnet50(ResNet50Config(num_classes=7))
    off = resnet50(ResNet50Config(num_classes=7, zero_init_residual=False))
    assert torch.count_nonzero(on.layer1[0].bn3.weight) == 0
    assert torch.count_nonzero(off.layer1[0].bn3.weight) > 0
