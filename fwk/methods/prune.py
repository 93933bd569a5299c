"""``prune_gradually``: structured pruning during training (design notes 002 §4.1).

``ratio`` of the channels (and of the GPT's attention heads) are removed in ``steps`` even
stages between ``start`` and ``end`` (shares of ``train.max_steps``), each stage removing
the same share of the channels left, ranked by the L2 norm of their weights. torch-pruning
does the removal (the same rounds as ``fwk export --prune magnitude``), so the model that
trains on is a smaller dense model, and the run exports it as it is, without retraining
rounds.

What follows the removed channels:
- the optimizer's state: every per-weight tensor (Adam's moments, momentum, schedule-free's
  ``z``) is sliced exactly as its weight, as torch-pruning slices it, so training goes on
  where it was;
- the strategies that hold the parameters: DDP builds its reducer again, the rollback
  snapshot is retaken (``reshaped``, given by the loop);
- a resumed run: the checkpoint keeps the removals (torch-pruning's pruning history); they
  are replayed on the freshly built model before its weights are loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from fwk.methods.base import Method


def _holders(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """The optimizers that own parameter state (optim=muon: its Muon and its AdamW)."""
    from fwk.optim.muon import MuonAdamW

    return [optimizer.muon, optimizer.adamw] if isinstance(optimizer, MuonAdamW) else [optimizer]


@contextmanager
def following(optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """While torch-pruning slices parameters: slice the optimizer's state of each the same
    way, and put the new parameters in its groups in place of the old.

    Every slice goes through torch-pruning's ``BasePruningFunc._prune_parameter_and_grad``
    (weight, kept indices, dim) -> new parameter; a weight sliced twice (its outputs, then
    its inputs) is followed through both."""
    from torch_pruning.pruner.function import BasePruningFunc

    original = BasePruningFunc._prune_parameter_and_grad
    origin: dict[int, nn.Parameter] = {}  # new parameter -> the optimizer's parameter it replaces
    states: dict[int, dict[str, Any]] = {}  # new parameter -> its sliced state
    made: dict[int, nn.Parameter] = {}  # every parameter torch-pruning made, by id
    holders = _holders(optimizer) if optimizer is not None else []

    def slicing(self: Any, weight: nn.Parameter, keep_idxs: list[int], pruning_dim: int) -> nn.Parameter:
        pruned = original(self, weight, keep_idxs, pruning_dim)
        if weight.dim() == 4 and _format(weight) == torch.channels_last:
            pruned.data = pruned.data.contiguous(memory_format=torch.channels_last)  # as it was
        first = origin.pop(id(weight), weight)
        state = states.pop(id(weight), None)
        if state is None:
            state = next((dict(h.state[first]) for h in holders if first in h.state), {})
        keep = torch.tensor(keep_idxs, dtype=torch.long, device=weight.device)
        states[id(pruned)] = {
            k: v.index_select(pruning_dim, keep).contiguous(memory_format=_format(pruned))
            if isinstance(v, torch.Tensor) and v.shape == weight.shape
            else v
            for k, v in state.items()
        }
        origin[id(pruned)], made[id(pruned)] = first, pruned
        return pruned

    BasePruningFunc._prune_parameter_and_grad = slicing
    try:
        yield
    finally:
        BasePruningFunc._prune_parameter_and_grad = original
    replaced = {id(origin[i]): made[i] for i in origin}  # the optimizer's parameter -> its last slice
    for holder in holders:
        for group in holder.param_groups:
            group["params"] = [replaced.get(id(p), p) for p in group["params"]]
        for i in origin:
            old, new = origin[i], made[i]
            if holder.state.pop(old, None) is not None and states[i]:
                holder.state[new] = states[i]


def _format(p: torch.Tensor) -> torch.memory_format:
    channels_last = p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
    return torch.channels_last if channels_last else torch.contiguous_format


def _size(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


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
        from fwk.models.pruning import per_round

        if not any(isinstance(m, (nn.Linear, nn.Conv2d)) for m in model.modules()):
            from fwk.errors import UserError

            raise UserError(
                f"methods: prune_gradually removes channels of Linear and Conv2d layers, and "
                f"{type(model).__name__} has none; remove it from methods"
            )
        self.model, self.full = model, _size(model)
        self.share = per_round(self.cfg.ratio, len(self.at))

    def attach(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, reshaped: Callable[[int | None], None]
    ) -> None:
        from fwk.strategies.fsdp import is_sharded

        if is_sharded(model):  # parallel=auto chose FSDP for a model too big to replicate
            from fwk.errors import UserError

            raise UserError(
                "methods=[prune_gradually] with a sharded model (parallel=auto chose FSDP): it slices whole "
                "weights; use parallel=ddp if the model fits each device, or drop prune_gradually"
            )
        self.optimizer, self.model, self.reshaped = optimizer, model, reshaped

    def after_step(self, step: int, model: nn.Module) -> None:
        if self.done >= len(self.at) or step + 1 != self.at[self.done]:
            return
        from fwk.models.pruning import prune_round

        last = self.done == len(self.at) - 1
        with self._quiet(model), following(self.optimizer):
            self.history += prune_round(
                model, self._example(), "magnitude", self.share, self.cfg.round_to if last else 1
            )
        self.done += 1
        self.reshaped(step + 1)
        left = _size(model)
        self.say(
            f"step {step + 1}: prune_gradually stage {self.done}/{len(self.at)}: {left:,} of {self.full:,} "
            f"parameters left ({left / self.full:.1%})"
        )

    @contextmanager
    def _quiet(self, model: nn.Module) -> Iterator[None]:
        """torch-pruning traces a forward: in eval mode (BatchNorm statistics untouched)."""
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
        """Replay the checkpoint's removals on the freshly built model (before its weights load)."""
        from fwk.models.pruning import replay

        history = [(str(n), bool(o), [int(i) for i in idx]) for n, o, idx in state["history"]]
        if history and not self.history:
            with self._quiet(self.model), following(self.optimizer):
                replay(self.model, self._example(), history)
            self.reshaped(None)
        self.history, self.done = history, int(state["done"])


def trained_history(state: dict[str, Any]) -> list[tuple[str, bool, list[int]]]:
    """The removals a run made while training (a checkpoint's state), to replay before loading."""
    saved = (state.get("methods") or {}).get(PruneGradually.name) or {}
    return [(str(n), bool(o), [int(i) for i in idx]) for n, o, idx in saved.get("history", [])]
