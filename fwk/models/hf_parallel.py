"""A Hugging Face model under tensor parallelism: its own plan, applied to the built model.

transformers (5.x) names the plan itself. The plan is the config's ``base_model_tp_plan``,
whose keys are relative to the base model, e.g. ``layers.*.self_attn.q_proj``. It adds the
model class's ``_tp_plan``, e.g. ``lm_head: colwise_gather_output``, and the vocabulary-split
input embedding. transformers applies it only in ``from_pretrained(distributed_config=...)``.
Here the same two steps run on a model that fwk built already.
``DistributedMixin._resolve_parallel_plans`` gives the plan with the base model's prefix and
the layer numbers filled in. ``distributed.tensor_parallel.apply_tensor_parallelism`` makes
each named parameter a DTensor and hooks each named module's forward. The projections split
by output columns compute ``heads / tp`` heads per rank (Llama's attention reshapes with
``-1`` heads). The logits come back whole on every rank.

The model must be identical on every rank, from the same seed: each rank keeps its slice of
its own copy, and nothing is sent. Parameter names are unchanged, so checkpoints see the plain
names.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from fwk.distributed.collectives import grads_laid_out_as_params
from fwk.errors import UserError

logger = logging.getLogger(__name__)

# config keys whose values are split over the ranks: each must divide by the degree
DIVIDED = ("num_attention_heads", "num_key_value_heads", "intermediate_size")
# instance attributes of an attention module that count heads (reshapes that do not use -1)
HEAD_COUNTS = ("num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads", "n_heads", "n_kv_heads")


def tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Apply a Hugging Face model's own tensor-parallel plan in place, over the 1-D mesh tp_mesh.

    The plan is its config's base_model_tp_plan, e.g. LlamaConfig.base_model_tp_plan.
    ``model`` is a transformers ``PreTrainedModel``, or fwk's wrapper of one (``fwk/models/hf.py``).
    The wrapper's loss then comes from the model's gathered logits, because its fused
    ``head_loss`` takes the head's whole matrix."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES
    from transformers.distributed.tensor_parallel import TensorParallelLayer, apply_tensor_parallelism

    assert tp_mesh.ndim == 1, f"tensor_parallel takes a 1-D mesh, not {tp_mesh.ndim}-D"
    hf = _transformers_model(model)
    assert not any(isinstance(p, DTensor) for p in hf.parameters()), "tensor_parallel: the model is sharded already"
    degree = tp_mesh.size()
    text = hf.config.get_text_config()
    if not (getattr(text, "base_model_tp_plan", None) or getattr(hf.config, "base_model_tp_plan", None)):
        raise UserError(f"model=hf: {hf.config.model_type} has no base_model_tp_plan; use parallel.tp=1")
    for key in DIVIDED:
        value = getattr(text, key, None)
        if isinstance(value, int) and value % degree:
            raise UserError(
                f"model=hf: {key}={value} is not divisible by parallel.tp={degree} "
                f"(each rank holds {key} / tp); use a tp degree that divides it"
            )

    # {module or parameter FQN: style name}, layer numbers filled in (model.layers.0.self_attn.q_proj.weight, ...)
    plan, _, _ = hf._resolve_parallel_plans(DistributedConfig(tp_size=degree))
    names = [n for n, _ in hf.named_parameters()]
    every = dict(hf.named_parameters(remove_duplicate=False))
    # tied parameters (lm_head.weight is model.embed_tokens.weight): named_parameters() lists each once, and
    # apply_tensor_parallelism knows a parameter only by that name. The others are sharded and tied again below.
    first = {id(p): n for n, p in reversed(list(every.items()))}
    tied = {n: first[id(p)] for n, p in every.items() if first[id(p)] != n}
    planned = {n: s for n, s in plan.items() if n in every and _shards(ALL_PARALLEL_STYLES[s], TensorParallelLayer)}
    for name, source in tied.items():
        if (name in planned) != (source in planned):
            raise UserError(
                f"model=hf: the tensor-parallel plan splits {name if name in planned else source} but not the "
                f"weight tied to it ({source if name in planned else name}); use parallel.tp=1"
            )

    if hf._mesh_manager is None:  # the unit styles (heads fewer than ranks) build their meshes from it
        hf._mesh_manager = _mesh_manager(tp_mesh)
    apply_tensor_parallelism(hf, tp_mesh, {n: s for n, s in plan.items() if n not in tied})
    hf._tp_size = degree  # generation sizes its key/value cache by the local heads
    hf._device_mesh = tp_mesh

    for name, source in tied.items():
        if name not in planned:
            continue
        owner, _, leaf = name.rpartition(".")
        module = hf.get_submodule(owner)
        # the module's own slot still holds the whole tensor: its style shards it, to check the placements agree
        ALL_PARALLEL_STYLES[planned[name]].shard_param(
            module, leaf, tp_mesh, config=text, mesh_manager=hf._mesh_manager
        )
        mine, theirs = module._parameters[leaf], hf.get_parameter(source)
        if not isinstance(theirs, DTensor) or mine.placements != theirs.placements:
            raise UserError(
                f"model=hf: the tensor-parallel plan splits the tied {name} and {source} differently "
                f"({planned[name]}, {planned[source]}); set tie_word_embeddings=false or use parallel.tp=1"
            )
        module._parameters[leaf] = theirs  # tied again: one parameter, one gradient

    _local_head_counts(hf, plan, degree)
    grads_laid_out_as_params(hf)
    whole = [n for n in planned if not isinstance(hf.get_parameter(n), DTensor)]
    assert not whole, f"tensor-parallel plan left {whole[0]} whole"
    assert [n for n, _ in hf.named_parameters()] == names, "tensor parallel changed the parameter names"
    if hasattr(model, "head_of") and model is not hf:
        model.head_of = None  # fwk's wrapper: the loss from the gathered logits, not head_loss on a shard
    logger.debug(f"tensor parallel over {degree} ranks: {len(planned)} parameters of {hf.config.model_type} sharded")


def _transformers_model(model: nn.Module) -> Any:
    """Return the transformers model in ``model``: itself, or the one its fwk wrapper holds."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return model
    inner = getattr(model, "hf", None)
    if isinstance(inner, PreTrainedModel):
        return inner
    raise TypeError(f"tensor_parallel takes a transformers model, not {type(model).__name__}")


def _shards(style: object, base: type) -> bool:
    """Return whether a transformers parallel style makes its parameters DTensors.

    The styles that do are colwise, rowwise, embedding_*, packed_* and unit_*. The others only
    hook a forward, such as replicate and all_reduce."""
    return type(style).shard_param is not base.shard_param


def _local_head_counts(hf: nn.Module, plan: dict[str, str], degree: int) -> None:
    """Make the attention modules that keep a head count for a reshape compute ``count / tp`` heads.

    Each holds the heads of its rank, by an output-column split (``colwise``). Llama's keeps none."""
    split = {name.rpartition(".")[0] for name, style in plan.items() if style == "colwise"}
    for name, module in hf.named_modules():
        if name in split:
            for attr in HEAD_COUNTS:
                value = getattr(module, attr, None)
                if isinstance(value, int) and not isinstance(value, bool) and value % degree == 0:
                    setattr(module, attr, value // degree)


def _mesh_manager(tp_mesh: DeviceMesh) -> Any:
    """Return what transformers' styles ask of its ``TransformersDeviceMesh``: the tp mesh.

    It gives the tp mesh whatever its dimension is named. The styles that ask are the unit
    styles, for heads fewer than ranks."""
    from transformers.distributed.utils import TransformersDeviceMesh

    class OneMesh(TransformersDeviceMesh):
        def get_mesh(self, dims: str | tuple[str, ...]) -> DeviceMesh:
            return tp_mesh

    return OneMesh(tp_mesh, tp_mesh)


__all__ = ["tensor_parallel"]
