"""Stage 1: prune whole structures with torch-pruning, and retrain through the engine.

Whole channels, such as conv filters and hidden units, and whole attention heads are removed,
so the pruned model is a smaller dense model that every runtime speeds up, unlike zeroed
weights. torch-pruning traces the model into a dependency graph, so a removed channel
disappears from every layer that touches it: the next conv's input, the BatchNorm, the
residual add.

Two things are never pruned. One is the classifier's output, the model's last Linear/Conv,
whose width is the number of classes or the vocabulary. The other, in transformers, is the
residual stream: the embedding width, shared by every block and the tied output embedding.
Attention loses whole heads, and the MLP loses hidden units. The last round leaves channel
counts at multiples of ``export.round_to`` wherever every prunable layer keeps at least 4x
that many. Its default, 8, is what vectorized int8 and fp32 kernels like, and torch-pruning
rounds the count kept down.

The methods all work in rounds, set by ``--rounds K``. Each round removes
``1 - (1 - R) ** (1 / K)`` of the channels left, so ``R`` is reached after K rounds.

- ``lottery_ticket``: iterative magnitude pruning with weight rewinding (Frankle et al.,
  "Linear Mode Connectivity and the Lottery Ticket Hypothesis"). Each round ranks the
  trained weights, removes the weakest channels, rewinds the survivors to the run's
  rewind weights and retrains ``export.retrain_frac`` of the run's steps with its own
  schedule. The rewind weights are ``runs/<id>/rewind/step-N.pt``, saved early in training
  by the engine.
- ``magnitude`` / ``taylor``: rank by weight norm, or by first-order Taylor importance, which
  is |weight x gradient| on a few training batches. Then remove, and fine-tune the trained
  survivors for ``export.finetune_frac`` of the steps at ``export.finetune_lr_factor`` x the lr.

Every removal is recorded in torch-pruning's pruning history: module name, in/out, indices.
The pruned model is always rebuilt the same way: the run's model built fresh from its
config, the history replayed on it, then the weights loaded. ``rebuild`` is what the
retrain rounds, the export and the tests use. ``pruning_history.json`` in the export
makes the result reproducible from the run.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fwk.errors import UserError
from fwk.export.report import HISTORY
from fwk.models.pruning import History, count, per_round, prune_round, replay  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from fwk.config.export_schema import ExportConfig
    from fwk.export.settings import PrunePlan
    from fwk.export.source import Source

logger = logging.getLogger(__name__)


@dataclass
class Rebuild:
    """Turn the run's freshly built model into the pruned one with ``weights``, which the
    engine trains (``retrain``).

    ``weights`` fit either the pruned model (``pruned=True``) or the original one. For the
    original, the replayed history slices its tensors, as lottery-ticket rewinding needs."""

    history: History
    weights: dict[str, torch.Tensor]
    example: torch.Tensor
    pruned: bool

    def __call__(self, model: nn.Module) -> nn.Module:
        if not self.pruned:
            model.load_state_dict(self.weights)
        replay(model, self.example, self.history)
        if self.pruned:
            model.load_state_dict(self.weights)
        return model


# --- the stage --------------------------------------------------------------------------


@dataclass
class Pruned:
    model: nn.Module  # eval mode, CPU, fp32
    history: History
    before: dict[str, int]
    after: dict[str, int]
    rounds: list[dict[str, Any]]
    round_to: int


def example_input(source: Source) -> torch.Tensor:
    """Return one validation sample as a batch of one, for torch-pruning to trace the model with."""
    from fwk.export.capture import example_input

    return example_input(source.data.val)[:1]


def rewind_weights(source: Source) -> tuple[Path, dict[str, torch.Tensor]]:
    """Load the run's rewind weights from ``runs/<id>/rewind/step-N.pt``. Say in one line when
    it has none."""
    folder = source.run.path / "rewind"
    found = sorted(folder.glob("step-*.pt")) if folder.is_dir() else []
    if not found:
        raise UserError(
            f"run {source.run.id} has no rewind weights in {folder} (trained with checkpoint.rewind_at=0, or "
            "by an fwk that kept none); use --prune magnitude, or retrain it with checkpoint.rewind_at=0.02"
        )
    try:
        state = torch.load(found[0], map_location="cpu", weights_only=True)
        return found[0], state["model"]
    except Exception as exc:  # noqa: BLE001 - a damaged file of any kind is one line
        raise UserError(f"rewind weights {found[0]} cannot be read ({exc}); use --prune magnitude") from None


def _taylor_grads(source: Source, batches: int, batch_size: int) -> Callable[[nn.Module], None]:
    """Compute the gradients of the training loss on a few training batches, since Taylor
    importance needs them."""
    import torch.nn.functional as F

    from fwk.export.source import training_sample
    from fwk.export.verify import batches as batched

    def grads(model: nn.Module) -> None:
        model.eval()  # BatchNorm uses its running statistics: the ranking does not change them
        for x, y in batched(training_sample(source, batches * batch_size), batch_size):
            x, y = torch.from_numpy(x), torch.from_numpy(y)
            if source.data.task == "lm":
                loss = model(x, y)
            else:
                loss = F.cross_entropy(model(x), y)
            loss.backward()

    return grads


def prune(source: Source, plan: PrunePlan, cfg: ExportConfig, out: Path) -> Pruned:
    """Run ``plan.rounds`` rounds of prune, then rewind or keep, then retrain. A lottery ticket
    rewinds, and a fine-tune keeps the weights.

    Writes ``out/pruning_history.json`` and one run dir per round under ``out/rounds/``.
    """
    from fwk.export.retrain import retrain, retrain_config, steps_for
    from fwk.models.build import build_model

    method, rounds = plan.method, plan.rounds
    example = example_input(source)
    before = count(source.model, example)
    share = per_round(plan.ratio, rounds)
    if method == "lottery_ticket":
        rewind_file, rewind = rewind_weights(source)
        steps, lr_factor = steps_for(source.config, cfg.retrain_frac), 1.0
        logger.info(
            f"lottery ticket: {rounds} round(s) of {share:.1%} of the channels left, rewinding to "
            f"{rewind_file.name} and retraining {steps} steps each"
        )
    else:
        steps, lr_factor = steps_for(source.config, cfg.finetune_frac), cfg.finetune_lr_factor
        logger.info(
            f"{method} pruning: {rounds} round(s) of {share:.1%} of the channels left, fine-tuning {steps} steps each"
        )
    grads = _taylor_grads(source, cfg.taylor_batches, cfg.batch_size) if method == "taylor" else None
    retrain_cfg = retrain_config(source.config, steps, lr_factor)

    model = copy.deepcopy(source.model).eval()
    history: History = list(source.history)  # removals made while training first: a fresh model replays all
    records = []
    for r in range(1, rounds + 1):
        # rounding down to a multiple every round would overshoot the ratio: only the last one rounds
        history += prune_round(model, example, method, share, cfg.round_to if r == rounds else 1, grads)
        if method == "lottery_ticket":  # the survivors go back to their early values
            start = Rebuild(list(history), rewind, example, pruned=False)
        else:
            start = Rebuild(list(history), model.state_dict(), example, pruned=True)
        pruned = start(build_model(source.config.model, source.data, init=False))  # the weights are the run's
        weights, summary = retrain(retrain_cfg, pruned, out / "rounds" / f"round-{r}")
        shape = build_model(source.config.model, source.data, init=False)
        model = Rebuild(list(history), weights, example, pruned=True)(shape)
        model = model.float().eval()
        sizes = count(model, example)
        records.append({"round": r, "steps": steps, **sizes, "eval": summary["eval"]})
        logger.info(
            f"round {r}/{rounds}: {sizes['params'] / before['params']:.1%} of the parameters, "
            f"{sizes['macs'] / before['macs']:.1%} of the MACs left; "
            + ", ".join(f"{k} {v:.4g}" for k, v in summary["eval"].items())
        )
    (out / HISTORY).write_text(json.dumps({"method": method, "history": history}) + "\n")
    after = {k: records[-1][k] for k in before}
    return Pruned(model=model, history=history, before=before, after=after, rounds=records, round_to=cfg.round_to)


def load_history(path: Path) -> History:
    return [(str(n), bool(o), [int(i) for i in idx]) for n, o, idx in json.loads(path.read_text())["history"]]
