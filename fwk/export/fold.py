"""Stage 1: fold every Conv->BatchNorm pair of the eval-mode model with fwk.export.fuse.

A folded BatchNorm is one conv with a new weight and bias: the exported graph has no
BatchNormalization nodes, and int8 quantization then calibrates the conv that really
runs, not a conv whose output a BatchNorm still rescales.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fwk.export.fuse import fold_conv_bn

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@dataclass
class Folded:
    model: nn.Module  # an eval-mode copy; the original is untouched
    norms_before: int
    norms_after: int

    @property
    def folded(self) -> int:
        return self.norms_before - self.norms_after


def count_norms(model: nn.Module) -> int:
    return sum(isinstance(m, _NORMS) for m in model.modules())


def fold(model: nn.Module) -> Folded:
    before = count_norms(model)
    folded = fold_conv_bn(model)
    return Folded(model=folded, norms_before=before, norms_after=count_norms(folded))
