"""``early_exit``: dynamic depth. Exit heads on intermediate blocks train with the model, and
a threshold on their softmax entropy, calibrated after training, says where each sample may
leave.

``prepare`` hooks the heads into the plain model (``fwk/models/exits.py``) before the
optimizer is built, so the optimizer, DDP and the checkpoints hold them. The step's loss is

    (sum_i w_i * CE(exit i) + 1.0 * CE(final)) / (sum_i w_i + 1.0)

with ``weights`` w_i, by default (i + 1) / (n + 1) for exit i of n: rising with depth, and
below the final output's 1.0. Evaluation during training is the full model's.

After the final evaluation, ``finished`` calibrates on the validation split. A sample leaves
at the first exit whose softmax entropy is below the threshold, and ``calibrate`` picks the
largest threshold whose accuracy stays within ``max_drop`` of the full model's (for an LM,
whose mean loss rises by at most ``max_drop`` nats). The search is exact: it tries every
threshold at which some sample changes exit. The threshold is the method's state, saved with
the final checkpoint again, and the run's ``summary.json`` records it under ``early_exit``
with the accuracy or loss with and without exits, each exit's own, the share of samples
leaving at each exit and at the end, and the mean depth: the share of the blocks run.

An LM's tokens leave one by one. A generating runtime must then fill the skipped blocks'
KV cache of the tokens that leave early, which this depth figure does not count.

Per-sample loss reweighting by each sample's exit under the current threshold is not built:
no threshold exists before calibration, and one made during training would need its own
calibration rounds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fwk.config.methods import Config, Rule
from fwk.distributed.dims import shards_model
from fwk.errors import UserError
from fwk.methods.base import Method, method
from fwk.registry import doc

if TYPE_CHECKING:
    import torch
    from torch import nn

logger = logging.getLogger(__name__)

DROP = {"classification": 0.01, "lm": 0.05}  # max_drop's default: accuracy given up, or nats of loss added


@dataclass
class EarlyExitConfig:
    """Exit heads on intermediate blocks, trained with the model, and an entropy threshold calibrated on val."""

    exits: list[int] = doc(
        [], "block indices an exit follows, increasing; empty: after each ResNet stage, each CNN conv block, "
        "each quarter of a GPT's layers (never the last block)"
    )  # fmt: skip
    weights: list[float] = doc([], "loss weight of each exit (the final output's is 1.0); empty: (i+1)/(n+1)")
    max_drop: float | None = doc(
        None, "accuracy the exits may give up (a share), or nats an LM's loss may rise; none: 0.01, or 0.05 nats"
    )

    def rules(self, c: Config) -> Iterator[Rule]:
        """Check its settings, and what it cannot be combined with."""
        key = "method.early_exit."
        increasing = all(isinstance(b, int) and b >= 0 for b in self.exits) and self.exits == sorted(set(self.exits))
        yield increasing, f"{key}exits", self.exits, "block indices >= 0 in increasing order (empty: automatic)"
        yield all(w > 0 for w in self.weights), f"{key}weights", self.weights, "loss weights > 0"
        yield (
            not self.weights or not self.exits or len(self.weights) == len(self.exits),
            f"{key}weights",
            self.weights,
            f"one weight per exit (exits {self.exits})",
        )
        yield self.max_drop is None or self.max_drop >= 0, f"{key}max_drop", self.max_drop, "a number >= 0, or none"
        if "early_exit" not in c.methods:
            return
        yield (
            not shards_model(c),
            "parallel.name",
            c.parallel.name,
            "ddp, none or auto with methods=[early_exit] (its hooks read whole blocks' outputs; FSDP, tp and pp "
            "hold parts)",
        )
        for other in ("ema", "prune_gradually"):  # ema's copy would hook the original; pruning would cut the heads
            yield other not in c.methods, "methods", list(c.methods), f"no {other} with early_exit; drop one"


@method(EarlyExitConfig)
class EarlyExit(Method):
    name = "early_exit"

    def __init__(self, cfg: Any, max_steps: int) -> None:
        super().__init__(cfg, max_steps)
        self.threshold: float | None = None  # calibrated after training

    def prepare(self, model: nn.Module) -> None:
        from fwk.models.exits import attach

        self.heads = attach(model, self.cfg.exits, self.example)
        n = len(self.heads.exits)
        if self.cfg.weights and len(self.cfg.weights) != n:
            raise UserError(
                f"method.early_exit.weights={self.cfg.weights} is not allowed: expected one weight per exit "
                f"(exits {self.heads.exits})"
            )
        self.weights = tuple(float(w) for w in self.cfg.weights) or tuple((i + 1) / (n + 1) for i in range(n))

    def attach(self, optimizer: torch.optim.Optimizer, model: nn.Module, reshaped: Any) -> None:
        from fwk.distributed.sharded import is_sharded

        if is_sharded(model):  # parallel=auto chose FSDP for a model too big to replicate
            raise UserError(
                "methods=[early_exit] with a sharded model (parallel=auto chose FSDP): its hooks read whole blocks' "
                "outputs; use parallel=ddp if the model fits each device, or drop early_exit"
            )

    def loss(self, loss: Any) -> Any:
        from fwk.models.exits import ExitLoss

        return ExitLoss(label_smoothing=loss.label_smoothing, fused=loss.fused, heads=self.heads, weights=self.weights)

    def finished(self, model: nn.Module, validation: Any) -> dict[str, Any]:
        """Calibrate the threshold on the validation split, check it with an evaluation through
        the exits, say the figures in one line and return them for ``summary.json``."""
        task = validation.task
        samples = validation.exit_samples(model)  # fwk.engine.evaluate.Validation
        max_drop = DROP[task] if self.cfg.max_drop is None else self.cfg.max_drop
        found = calibrate(samples.entropy, samples.score, max_drop, task == "lm", self.heads.block_share())
        self.threshold = found["threshold"]
        metric = "val_loss" if task == "lm" else "val_acc"
        result = {"exits": self.heads.exits, "metric": metric, **found, "eval": validation(model, self.threshold)}
        shares = ", ".join(f"{s:.0%}" for s in found["share"])
        logger.info(
            f"early_exit: threshold {self.threshold:.4g} nats of entropy: {metric} {found['with_exits']:.4f} with "
            f"exits, {found['full']:.4f} full (max drop {max_drop:g}); leaving at exits after blocks "
            f"{', '.join(str(b) for b in self.heads.exits)} and at the end: {shares}; mean depth "
            f"{found['mean_depth']:.2f} of the blocks"
        )
        return result

    @classmethod
    def exported(cls, state: dict[str, Any]) -> dict[str, Any] | None:
        """Return the model's weights without the exit heads, or None for a run without exits.
        ``fwk export`` rebuilds the plain model from them, and the formats that carry the exits
        hook the heads back in (``fwk.export.exits``)."""
        from fwk.models.exits import NAME

        if cls.name not in (state.get("methods") or {}):
            return None
        weights = state.get("eval_weights") or state.get("model")  # schedule-free's x, where evaluation used it
        return {k: v for k, v in weights.items() if not k.startswith(f"{NAME}.")} if weights else None

    def describe(self) -> str:
        weights = ", ".join(f"{w:.3g}" for w in self.weights)
        return (
            f"early_exit: exits after blocks {', '.join(str(b) for b in self.heads.exits)} of "
            f"{self.heads.depth}, loss weights {weights} (final 1.0); the entropy threshold is calibrated on val "
            "after training"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.threshold = state.get("threshold")


def calibrate(
    entropy: torch.Tensor, score: torch.Tensor, max_drop: float, loss: bool, depth: list[float]
) -> dict[str, Any]:
    """Return the largest entropy threshold whose mean score stays within ``max_drop`` of the
    full model's, and the figures at it.

    ``entropy`` (exits, N) is each exit's softmax entropy per sample, ``score`` (exits + 1, N)
    each exit's and the final output's score: 1/0 for right/wrong, or a loss when ``loss``
    (then a higher mean is worse). ``depth`` is the share of the blocks run to each exit and
    1.0 for the final. A sample leaves at the first exit whose entropy is below the threshold.

    Exit i is ever a sample's exit when its entropy is below every earlier exit's. Raising the
    threshold past that entropy moves the sample there from the next deeper such exit, or the
    final output. So the mean score is constant between those entropies, and trying each of
    them, plus one above them all, is exact. The threshold equal to an entropy is the largest
    of its interval, since a sample leaves only below it.
    """
    import torch

    exits, n = entropy.shape
    entropy, score = entropy.double(), score.double()
    inf = torch.full((1, n), math.inf, dtype=torch.float64)
    earlier = torch.cat([inf, entropy.cummin(0).values[:-1]])  # (exits, N): the lowest entropy before each exit
    record = entropy < earlier  # exit i is this sample's exit for thresholds in (entropy[i], earlier[i]]
    deeper = torch.full((exits, n), exits, dtype=torch.long)  # where it comes from: the next record, or the final
    below = torch.full((n,), exits, dtype=torch.long)
    for i in reversed(range(exits)):
        deeper[i] = below
        below = torch.where(record[i], i, below)
    gain = score[:exits] - score.gather(0, deeper)  # (exits, N): the score's change as the sample moves up
    at, order = entropy[record].sort()
    change = torch.cat([torch.zeros(1, dtype=torch.float64), gain[record][order].cumsum(0)])
    top = math.nextafter(at[-1].item(), math.inf) if at.numel() else 0.0
    candidates = torch.cat([at.unique(), torch.tensor([top], dtype=torch.float64)])
    full = score[exits].sum()
    sums = full + change[torch.searchsorted(at, candidates, right=False)]  # moves strictly below each candidate
    drop = (sums - full) / n if loss else (full - sums) / n
    threshold = candidates[drop <= max_drop].max().item()  # the smallest candidate never moves anyone: drop 0
    return {"threshold": threshold, "max_drop": max_drop, **at_threshold(entropy, score, threshold, depth)}


def at_threshold(entropy: torch.Tensor, score: torch.Tensor, threshold: float, depth: list[float]) -> dict[str, Any]:
    """Return the full model's mean score, the mean score with exits at ``threshold``, each exit's
    own, the share of samples leaving at each exit and at the end, and the mean depth."""
    import torch

    exits, n = entropy.shape
    entropy, score = entropy.double(), score.double()
    below = entropy < threshold
    taken = torch.where(below.any(0), below.int().argmax(0), exits)  # (N,): the first exit below, else the final
    share = torch.bincount(taken, minlength=exits + 1).double() / max(n, 1)
    return {
        "full": score[exits].mean().item(),
        "with_exits": score.gather(0, taken.unsqueeze(0)).mean().item(),
        "each_exit": score[:exits].mean(1).tolist(),
        "share": share.tolist(),
        "mean_depth": torch.tensor(depth, dtype=torch.float64)[taken].mean().item(),
    }
