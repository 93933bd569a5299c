"""``prune_gradually``: channels removed in stages while the model trains on.

``ratio`` of the channels, and of the GPT's attention heads, are removed in ``steps`` even
stages between ``start`` and ``end``, which are shares of ``train.max_steps``. Each stage
removes the same share of the channels left, ranked by the L2 norm of their weights.
torch-pruning does the removal, in the same rounds as ``fwk export --prune magnitude``. So the
model that trains on is a smaller dense model, and the run exports it as it is, without
retraining rounds.

What follows the removed channels:
- the optimizer's state: every per-weight tensor (Adam's moments, momentum, schedule-free's
  ``z``) is sliced exactly as its weight, as torch-pruning slices it, so training goes on
  where it was.
- the strategies that hold the parameters: DDP builds its reducer again, and the rollback
  snapshot is retaken (``reshaped``, given by the loop).
- a resumed run: the checkpoint keeps the removals, torch-pruning's pruning history. They
  are replayed on the freshly built model before its weights are loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


@dataclass
class PruneGraduallyConfig:
    """Channels and attention heads removed by torch-pruning in even stages during training."""

    ratio: float = doc(0.5, "share of the channels (and heads) removed by the last stage, in (0, 1)")
    steps: int = doc(4, "number of even pruning stages, each removing the same share of the channels left")
    start: float = doc(0.1, "share of train.max_steps after which the first stage prunes")
    end: float = doc(0.5, "share of train.max_steps after which the last stage prunes")
    round_to: int = doc(8, "the last stage keeps channel counts at multiples of this (where every layer keeps 4x)")

    def rules(self, c: Config) -> Iterator[Rule]:
        """Check its settings, and what it cannot be combined with."""
        key = "method.prune_gradually."
        yield 0 < self.ratio < 1, f"{key}ratio", self.ratio, "a share in (0, 1)"
        yield self.steps >= 1, f"{key}steps", self.steps, "an integer >= 1"
        share = "a share of train.max_steps with 0 <= start <= end < 1"
        yield 0 <= self.start <= self.end < 1, f"{key}start", self.start, share
        yield self.round_to >= 1, f"{key}round_to", self.round_to, "an integer >= 1"
        if "prune_gradually" not in c.methods:
            return
        yield (
            not shards_model(c),
            "parallel.name",
            c.parallel.name,
            "ddp, none or auto with methods=[prune_gradually] (it slices whole weights; FSDP, tp and pp hold parts)",
        )
        yield (
            "ema" not in c.methods,
            "methods",
            list(c.methods),
            "no ema with prune_gradually (the average would keep the removed channels); drop one",
        )
        yield (
            c.memory.name == "none",
            "memory.name",
            c.memory.name,
            "none with methods=[prune_gradually] (torch-pruning traces the model's graph, which activation "
            "checkpointing hides)",
        )


@method(PruneGraduallyConfig)
class PruneGradually(Method):
    name = "prune_gradually"
    reshapes = True  # the loop loads its state before the model's (a resume replays the removals first)

    def __init__(self, cfg: Any, max_steps: int) -> None:
        super().__init__(cfg, max_steps)
        n, span = cfg.steps, cfg.end - cfg.start
        at = [round(max_steps * (cfg.start + span * i / max(1, n - 1))) for i in range(n)]
        self.at = sorted({min(max(1, s), max_steps - 1) for s in at})  # after these many steps
        self.history: list[tuple[str, bool, list[int]]] = []
        self.done = 0
        self.optimizer: torch.optim.Optimizer | None = None
        self.reshaped: Callable[[int | None], None] = lambda steps: None

    def prepare(self, model: nn.Module) -> None:
        from torch import nn

        from fwk.models.pruning import per_round, size

        if not any(isinstance(m, (nn.Linear, nn.Conv2d)) for m in model.modules()):
            raise UserError(
                f"methods: prune_gradually removes channels of Linear and Conv2d layers, and "
                f"{type(model).__name__} has none; remove it from methods"
            )
        self.model, self.full = model, size(model)
        self.share = per_round(self.cfg.ratio, len(self.at))

    def attach(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, reshaped: Callable[[int | None], None]
    ) -> None:
        from fwk.distributed.sharded import is_sharded

        if is_sharded(model):  # parallel=auto chose FSDP for a model too big to replicate
            raise UserError(
                "methods=[prune_gradually] with a sharded model (parallel=auto chose FSDP): it slices whole "
                "weights; use parallel=ddp if the model fits each device, or drop prune_gradually"
            )
        self.optimizer, self.model, self.reshaped = optimizer, model, reshaped

    def after_step(self, step: int, model: nn.Module) -> None:
        if self.done >= len(self.at) or step + 1 != self.at[self.done]:
            return
        from fwk.models.pruning import following, prune_round, size

        last = self.done == len(self.at) - 1
        with self._quiet(model), following(self.optimizer):
            self.history += prune_round(
                model, self._example(), "magnitude", self.share, self.cfg.round_to if last else 1
            )
        self.done += 1
        self.reshaped(step + 1)
        left = size(model)
        logger.info(
            f"step {step + 1}: prune_gradually stage {self.done}/{len(self.at)}: {left:,} of {self.full:,} "
            f"parameters left ({left / self.full:.1%})"
        )

    @contextmanager
    def _quiet(self, model: nn.Module) -> Iterator[None]:
        """Keep the model in eval mode while torch-pruning traces a forward, so BatchNorm statistics stay untouched."""
        was = model.training
        model.eval()
        try:
            yield
        finally:
            model.train(was)

    def _example(self) -> torch.Tensor:
        device = next(self.model.parameters()).device
        return self.example.to(device)

    def describe(self) -> str:
        steps = ", ".join(str(s) for s in self.at)
        return (
            f"prune_gradually: {self.cfg.ratio:.0%} of the channels (and heads) removed in {len(self.at)} stages, "
            f"after steps {steps} (torch-pruning, by weight norm); the smaller model trains on and exports as it is"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history], "done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replay the checkpoint's removals on the freshly built model, before its weights load."""
        from fwk.models.pruning import following, replay

        history = [(str(n), bool(o), [int(i) for i in idx]) for n, o, idx in state["history"]]
        if history and not self.history:
            with self._quiet(self.model), following(self.optimizer):
                replay(self.model, self._example(), history)
            self.reshaped(None)
        self.history, self.done = history, int(state["done"])


def trained_history(state: dict[str, Any]) -> list[tuple[str, bool, list[int]]]:
    """Return the removals a run made while training, from a checkpoint's state, to replay before loading."""
    saved = (state.get("methods") or {}).get(PruneGradually.name) or {}
    return [(str(n), bool(o), [int(i) for i in idx]) for n, o, idx in saved.get("history", [])]
