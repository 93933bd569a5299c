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


def test_resnet18_small_input_keeps_32px_maps() -> None:
    from fwk.models.vision import ResNet18Config, resnet18

    torch.manual_seed(0)
    model = resnet18(ResNet18Config(num_classes=10, in_channels=1, small_input=True))
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1) and model.conv1.in_channels == 1
    assert isinstance(model.maxpool, torch.nn.Identity)
    x = torch.randn(2, 1, 32, 32)
    assert model.layer1(model.relu(model.bn1(model.conv1(x)))).shape == (2, 64, 32, 32)  # no downsampling in the stem
    assert model(x).shape == (2, 10)
    plain = resnet18(ResNet18Config(num_classes=10))
    assert plain.conv1.kernel_size == (7, 7) and not isinstance(plain.maxpool, torch.nn.Identity)
