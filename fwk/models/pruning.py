"""Structured pruning with torch-pruning: what may be pruned, one round of it, and its replay.

A recorded round is replayed on a freshly built model. ``fwk export --prune`` and
``methods=[prune_gradually]`` both prune with these.

Whole channels (conv filters, hidden units) and whole attention heads are removed, so the
pruned model is a smaller dense model. torch-pruning traces the model into a dependency
graph, so a removed channel disappears from every layer that touches it: the next conv's
input, the BatchNorm, the residual add. Two things are never pruned: the classifier's output,
which is the model's last Linear/Conv, and, in transformers, the residual stream, which is the
embedding width. Attention loses whole heads, and the MLP loses hidden units. Every removal is
recorded in torch-pruning's pruning history (module name, in/out, indices), which ``replay``
applies to a fresh model. While training, ``following`` slices the optimizer's state with each
weight it removes from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fwk.errors import UserError

History = list[tuple[str, bool, list[int]]]


def per_round(ratio: float, rounds: int) -> float:
    """Return the share of the channels left that each round removes.

    With that share, ``ratio`` is reached after ``rounds`` rounds."""
    return 1.0 - (1.0 - ratio) ** (1.0 / rounds)


# --- what may be pruned --------------------------------------------------------------------


def _attention(model: nn.Module) -> Iterator[nn.Module]:
    """Yield the attention modules with a fused qkv Linear and an ``n_head`` attribute, as in fwk's GPT."""
    for m in model.modules():
        if isinstance(getattr(m, "qkv", None), nn.Linear) and isinstance(getattr(m, "n_head", None), int):
            yield m


def head_dims(model: nn.Module) -> dict[str, int]:
    """Return the head width of each attention module, by name.

    Whole heads are removed, and their width stays."""
    names = {m: n for n, m in model.named_modules()}
    return {names[m]: m.qkv.out_features // 3 // m.n_head for m in _attention(model)}


def _set_heads(model: nn.Module, dims: dict[str, int]) -> None:
    """Set each attention module's ``n_head`` after pruning, from its qkv width and its head width."""
    for name, m in model.named_modules():
        if name in dims:
            m.n_head = m.qkv.out_features // 3 // dims[name]


@dataclass
class Structure:
    ignored: list[nn.Module]
    num_heads: dict[nn.Module, int] = field(default_factory=dict)


def structure(model: nn.Module) -> Structure:
    """Return the layers whose outputs are kept whole, and the attention modules' heads."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    if not layers:
        raise UserError(f"{type(model).__name__} has no Linear or Conv2d layer to prune; use --prune none")
    ignored = [layers[-1]]  # the classifier / language-model head: its outputs are the classes
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    heads = {m.qkv: m.n_head for m in _attention(model)}
    if embeddings:  # a transformer: the residual stream keeps its width
        width = embeddings[0].embedding_dim
        ignored += [m for m in layers if isinstance(m, nn.Linear) and m.out_features == width]
    return Structure(ignored=ignored, num_heads=heads)


def _round_to(model: nn.Module, st: Structure, wanted: int, ratio: float) -> int | None:
    """Return the multiple to round channel counts to: ``wanted``, or None where it would overshoot.

    It is ``wanted`` when every prunable layer keeps at least 4 x ``wanted`` channels after this
    round, and None otherwise. torch-pruning rounds the count kept down. On a layer keeping 15
    channels, rounding to 8 would keep 8 and overshoot the ratio. From 32 kept on, rounding costs
    under a quarter.
    """
    if wanted <= 1:
        return None
    ignored = set(st.ignored) | set(st.num_heads)
    widths = [
        m.out_channels if isinstance(m, nn.Conv2d) else m.out_features
        for m in model.modules()
        if isinstance(m, (nn.Linear, nn.Conv2d)) and m not in ignored
    ]
    return wanted if all(w * (1 - ratio) >= 4 * wanted for w in widths) else None


# --- pruning and replaying ------------------------------------------------------------------


def count(model: nn.Module, example: torch.Tensor) -> dict[str, int]:
    """Return the MACs of one forward of ``example`` and the parameter count, by torch-pruning's counter."""
    import torch_pruning as tp

    macs, params = tp.utils.count_ops_and_params(model, example)
    return {"macs": int(macs), "params": int(params)}


def prune_round(
    model: nn.Module,
    example: torch.Tensor,
    method: str,
    ratio: float,
    round_to: int,
    grads: Callable[[nn.Module], None] | None = None,
) -> History:
    """Remove ``ratio`` of the channels (and heads) of ``model`` in place, and return this round's history."""
    import torch_pruning as tp

    st = structure(model)
    dims = head_dims(model)
    if method == "taylor":
        importance = tp.importance.GroupTaylorImportance()
    else:  # magnitude and lottery_ticket: the L2 norm of each channel's weights, over its whole group
        importance = tp.importance.GroupMagnitudeImportance(p=2)
    pruner = tp.pruner.BasePruner(
        model,
        example,
        importance=importance,
        pruning_ratio=ratio,
        ignored_layers=st.ignored,
        round_to=_round_to(model, st, round_to, ratio),
        num_heads=st.num_heads,
        prune_num_heads=bool(st.num_heads),
        prune_head_dims=False,
        head_pruning_ratio=ratio,
    )
    if grads is not None:
        model.zero_grad()
        grads(model)
    pruner.step()
    model.zero_grad(set_to_none=True)
    _set_heads(model, dims)
    return [(name, bool(out), [int(i) for i in idxs]) for name, out, idxs in pruner.pruning_history()]


def replay(model: nn.Module, example: torch.Tensor, history: History) -> nn.Module:
    """Apply a recorded pruning history to ``model`` in place, and return the model.

    The history is applied as torch-pruning recorded it."""
    import torch_pruning as tp

    dims = head_dims(model)
    graph = tp.DependencyGraph().build_dependency(model, example)
    graph.load_pruning_history([list(h) for h in history])
    _set_heads(model, dims)
    return model


# --- the optimizer follows a removal (methods=[prune_gradually] prunes while training) ------


def _holders(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """Return the optimizers that own parameter state: for optim=muon, its Muon and its AdamW."""
    from fwk.optim.muon import MuonAdamW

    return [optimizer.muon, optimizer.adamw] if isinstance(optimizer, MuonAdamW) else [optimizer]


@contextmanager
def following(optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """Make the optimizer follow the parameters that torch-pruning slices, inside this context.

    The optimizer's state of each parameter is sliced the same way, and the new parameters take
    the old ones' places in its groups. Every slice goes through torch-pruning's
    ``BasePruningFunc._prune_parameter_and_grad``, which maps (weight, kept indices, dim) to a new
    parameter. A weight sliced twice, by its outputs and then by its inputs, is followed through
    both."""
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


def size(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
