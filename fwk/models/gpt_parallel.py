"""fwk's GPT under tensor and pipeline parallelism: its plan and its split, beside the model.

Tensor parallel follows Megatron's layout. The fused q/k/v projection and the MLP's up
projection are split by output columns, and the attention's and the MLP's output projections
by input rows, so each block needs one all-reduce forward and one backward. Each rank computes
``n_head / tp`` heads. The token embedding is split by vocabulary rows and the tied head by
output columns, which are the same rows of the one matrix, and its logits are gathered whole.
The LayerNorms and the position table stay whole on every rank.

Pipeline parallel gives stage ``i`` the blocks ``[i * L / n, (i + 1) * L / n)``. The first
stage also holds the embeddings, and the last the final norm and the head. A stage keeps the
plain model's parameter names (the blocks by their index), so checkpoints reshard between
layouts. The head is tied to the token embedding, so the last stage holds that matrix too,
and the two copies' gradients are summed each step (``fwk/strategies/pipeline.py``).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel
from torch.distributed.tensor.placement_types import _StridedShard

from fwk.errors import UserError


def _copy_to_tp(x: torch.Tensor, mesh) -> torch.Tensor:
    """Return ``x`` unchanged, and in backward sum its gradient over the tensor-parallel ranks.

    Each rank holds the part of the gradient that flowed through its columns."""
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


class _FusedColumns(nn.Linear):
    """A Linear whose output is ``chunks`` projections side by side, such as q, k and v.

    It is split by columns inside each chunk: rank r computes the r-th slice of every chunk.
    Its weight is a DTensor whose whole value is the plain model's, so checkpoints see the
    plain matrix."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        assert isinstance(weight, DTensor)
        x = _copy_to_tp(x, weight.device_mesh)
        return F.linear(x, weight.to_local(), bias.to_local() if bias is not None else None)


class FusedColwise(ParallelStyle):
    """The column-wise split of a fused projection of ``chunks`` equal parts."""

    def __init__(self, chunks: int) -> None:
        super().__init__()
        self.chunks = chunks

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        assert type(module) is nn.Linear, f"FusedColwise shards an nn.Linear, not {type(module).__name__}"
        placement = [_StridedShard(0, split_factor=self.chunks)]  # each chunk split across the ranks
        for name, param in list(module.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.detach(), device_mesh, placement)
            module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        module.__class__ = _FusedColumns
        return module


def tp_plan(model: nn.Module, degree: int) -> dict[str, ParallelStyle]:
    """Return the plan for the modules this model, or pipeline stage, holds."""
    n_head = next((b.attn.n_head for b in model.blocks.children()), 0)
    if n_head % degree:
        raise UserError(f"parallel.tp={degree} must divide model.n_head={n_head} (each rank computes whole heads)")
    plan: dict[str, ParallelStyle] = {}
    if model.tok_emb is not None:
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate())
    if len(model.blocks):
        plan["blocks.*.attn.qkv"] = FusedColwise(3)
        plan["blocks.*.attn.proj"] = RowwiseParallel()
        plan["blocks.*.mlp.fc"] = ColwiseParallel()
        plan["blocks.*.mlp.proj"] = RowwiseParallel()
    if model.lm_head is not None:
        plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    return plan


def after_tp(model: nn.Module, degree: int) -> None:
    """Finish what the plan cannot say, once it is applied.

    Each attention computes its share of the heads, and the head is tied to the token embedding
    again, because the plan gave each its own sharded copy."""
    for module in model.modules():
        if hasattr(module, "n_head") and hasattr(module, "qkv"):
            module.n_head //= degree
    if model.lm_head is not None and model.tok_emb is not None:
        model.lm_head.weight = model.tok_emb.weight


def _view(model: nn.Module) -> nn.Module:
    """Return a module object of its own over ``model``'s submodules.

    Changing its children leaves ``model``'s in place."""
    view = copy.copy(model)
    view._modules = dict(model._modules)
    view._parameters = dict(model._parameters)
    view._buffers = dict(model._buffers)
    return view


def pipeline_split(model: nn.Module, n_stages: int) -> list[nn.Module]:
    """Cut the model into ``n_stages`` consecutive stages of blocks.

    Each stage keeps the plain model's parameter names."""
    layers = len(model.blocks)
    if n_stages > layers:
        raise UserError(
            f"{n_stages} pipeline stages (parallel.pp x parallel.pp_stages_per_rank) for model.n_layer={layers}: "
            f"each stage needs at least one block; use at most {layers} stages"
        )
    stages = []
    for i in range(n_stages):
        lo, hi = i * layers // n_stages, (i + 1) * layers // n_stages
        stage = _view(model)
        stage.blocks = nn.ModuleDict({str(j): model.blocks[j] for j in range(lo, hi)})
        first, last = i == 0, i == n_stages - 1
        if not first:
            stage.pos_emb = None  # receives hidden states (B, T, C), not token ids
            if not last:
                stage.tok_emb = None
        if not last:
            stage.ln_f = None
            stage.lm_head = None
        stages.append(stage)
    return stages


def merge(stages: list[nn.Module]) -> nn.Module:
    """Return one module over several stages of one rank, as interleaved schedules give it.

    It is what the optimizer, checkpoints and evaluation see, with the plain model's names."""
    if len(stages) == 1:
        return stages[0]
    local = _view(stages[0])
    blocks: dict[str, nn.Module] = {}
    for stage in stages:
        blocks.update(stage.blocks._modules)
        for name, child in stage._modules.items():
            if child is not None and name != "blocks":
                local._modules[name] = child
    local.blocks = nn.ModuleDict(dict(sorted(blocks.items(), key=lambda kv: int(kv[0]))))
    return local
