"""Conv-BN folding: same outputs in eval mode, fewer modules, the original untouched."""

from __future__ import annotations

import torch
import torchvision
from torch import nn

from fwk.export.fuse import fold_conv_bn


def _randomize_norms(model: nn.Module) -> None:
    """Fresh BatchNorms are identity maps; give them statistics worth folding."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.rand(m.num_features, generator=g) - 0.5)


def _count(model: nn.Module, kind: type) -> int:
    return sum(isinstance(m, kind) for m in model.modules())


class Untraceable(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it; the Sequential pairs still fold."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # depends on the values
            x = x * 2
        return self.body(x)


def test_resnet_folds_every_conv_bn_and_matches_in_eval() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    _randomize_norms(model)
    model.eval()
    folded = fold_conv_bn(model)
    x = torch.randn(4, 3, 48, 48)
    with torch.no_grad():
        # one conv + bias per folded pair: fp32 sums in another order, ~1e-6 relative
        torch.testing.assert_close(folded(x), model(x), rtol=1e-4, atol=1e-5)
    assert _count(folded, nn.BatchNorm2d) == 0
    assert _count(model, nn.BatchNorm2d) == 20  # the original keeps its BatchNorms


def test_untraceable_model_folds_adjacent_pairs() -> None:
    torch.manual_seed(0)
    model = Untraceable()
    _randomize_norms(model)
    model.eval()
    folded = fold_conv_bn(model)
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-4, atol=1e-5)
    assert _count(folded, nn.BatchNorm2d) == 0 and _count(folded, nn.Conv2d) == 2
