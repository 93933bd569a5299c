"""Conv-BatchNorm folding for evaluation and export.

In eval mode a BatchNorm after a convolution is an affine map with fixed statistics, so
it folds into the convolution's weight and bias: one kernel instead of two, the same
outputs up to float rounding. A ReLU after the pair stays a separate op. It has no
weights to fold, and a compiler fuses it into the conv's epilogue.

PyTorch's own utilities do the work. ``torch.fx.experimental.optimization.fuse`` traces
the model and folds every Conv->BN edge of the graph. A model that cannot be traced, because
of data-dependent control flow, falls back to folding Conv->BN pairs that sit next to each
other in an ``nn.Sequential``, with ``torch.nn.utils.fusion.fuse_conv_bn_eval``.
"""

from __future__ import annotations

import copy
import logging

from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

log = logging.getLogger("fwk")

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _fold_sequentials(model: nn.Module) -> int:
    folded = 0
    for module in model.modules():
        if not isinstance(module, nn.Sequential):
            continue
        names = list(module._modules)
        for a, b in zip(names, names[1:], strict=False):
            conv, norm = module._modules[a], module._modules[b]
            if isinstance(conv, _CONVS) and isinstance(norm, _NORMS) and norm.track_running_stats:
                module._modules[a] = fuse_conv_bn_eval(conv, norm)
                module._modules[b] = nn.Identity()
                folded += 1
    return folded


def fold_conv_bn(model: nn.Module) -> nn.Module:
    """Return an eval-mode copy of ``model`` with every foldable Conv->BatchNorm folded.

    The original is not touched. Train mode cannot be folded: BatchNorm then normalizes
    with the batch's own statistics.
    """
    frozen = copy.deepcopy(model).eval()
    if not any(isinstance(m, _NORMS) for m in frozen.modules()):
        return frozen
    from torch.fx.experimental.optimization import fuse

    try:
        return fuse(frozen).eval()
    except Exception as exc:  # not traceable by torch.fx as a whole: fold each part that is
        folded = _fold_parts(frozen)
        log.debug("fold_conv_bn: %s not traceable (%s); folded %d of its parts", type(model).__name__, exc, folded)
        return frozen


def _fold_parts(module: nn.Module) -> int:
    """Fold each child of ``module`` that torch.fx traces, the children's children of one that
    does not, and the pairs that sit next to each other in an ``nn.Sequential`` last. Return how
    many children were folded whole."""
    from torch.fx.experimental.optimization import fuse

    folded = 0
    for name, child in list(module.named_children()):
        if not any(isinstance(m, _NORMS) for m in child.modules()):
            continue
        try:
            module._modules[name] = fuse(child).eval()
            folded += 1
        except Exception:  # a container (ModuleList) or untraceable code: go one level down
            folded += _fold_parts(child)
    return folded + _fold_sequentials(module)
