"""model=hf under tensor parallelism (fwk/models/hf_parallel.py): a tiny Llama split over two
gloo processes by its own plan computes the one-process model's loss and gradients."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from fwk.errors import UserError
from fwk.models.hf_parallel import tensor_parallel
from tests.conftest import require

GLOO = dist.is_available() and dist.is_gloo_available()
LLAMA = {
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 64, "attention_dropout": 0.0,
}  # fmt: skip
B, T, TP = 2, 16, 2


def _llama(**overrides: object) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**{**LLAMA, **overrides}), dtype=torch.float32)
    model.config.use_cache = False
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, LLAMA["vocab_size"], (B, T + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _loss(model: torch.nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=idx).logits
    assert logits.shape == (B, T, LLAMA["vocab_size"]) and not isinstance(logits, dist.tensor.DTensor)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _compare(tied: bool) -> None:
    """On each rank: the plain model's loss and gradients, then the tp=2 model's, equal within 1e-5."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from fwk.models.hf import HFCausalLM

    idx, targets = _batch()
    plain = _llama(tie_word_embeddings=tied)
    expected = _loss(plain, idx, targets)
    expected.backward()

    model = _llama(tie_word_embeddings=tied)
    names = [n for n, _ in model.named_parameters()]
    wrapper = HFCausalLM(model)  # fwk's: forward(ids, targets) -> the loss
    tensor_parallel(wrapper, init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",)))
    assert [n for n, _ in model.named_parameters()] == names
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.to_local().shape[0] == LLAMA["num_attention_heads"] // TP * attn.head_dim
    assert attn.k_proj.weight.to_local().shape[0] == LLAMA["num_key_value_heads"] // TP * attn.head_dim
    assert model.lm_head.weight.to_local().shape[0] == LLAMA["vocab_size"] // TP
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied

    loss = _loss(model, idx, targets)
    assert abs(loss.item() - expected.item()) < 1e-5, (loss.item(), expected.item())
    loss.backward()
    want = dict(plain.named_parameters())
    sharded = 0
    for name, param in model.named_parameters():
        grad = param.grad
        assert grad is not None, f"{name}: no gradient"
        if isinstance(param, DTensor):
            sharded += 1
            assert isinstance(grad, DTensor) and grad.placements == param.placements, (name, grad.placements)
            grad = grad.full_tensor()
            assert torch.equal(param.full_tensor(), want[name].detach()), f"{name}: not the plain model's values"
        torch.testing.assert_close(grad, want[name].grad, atol=1e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
    assert sharded == 7 * LLAMA["num_hidden_layers"] + (1 if tied else 2)  # the layers' 7 matrices, embeddings, head

    # an optimizer step on the shards, each with its own rows of the gradient; fwk's groups (fwk/optim: matrices,
    # vectors) keep the DTensors apart from the whole norms, as foreach kernels take one kind per list
    for m in (plain, model):
        groups = [[p for p in m.parameters() if p.dim() >= 2], [p for p in m.parameters() if p.dim() < 2]]
        torch.optim.SGD([{"params": g} for g in groups], lr=0.1, momentum=0.9, foreach=True).step()
    for name, param in model.named_parameters():
        whole = param.full_tensor() if isinstance(param, DTensor) else param
        torch.testing.assert_close(whole, want[name], atol=1e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
    with torch.no_grad():  # transformers' inference path: local shards, explicit all-reduces
        expected_logits = plain(input_ids=idx).logits
        torch.testing.assert_close(model(input_ids=idx).logits, expected_logits, atol=1e-5, rtol=0)
        expected = F.cross_entropy(expected_logits.flatten(0, 1), targets.flatten())
        assert abs(wrapper(idx, targets).item() - expected.item()) < 1e-5  # fwk's wrapper: loss from the logits


def _worker(rank: int, store: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=TP,
                            timeout=timedelta(seconds=60))  # fmt: skip
    try:
        for tied in (False, True):
            _compare(tied)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not GLOO and os.environ.get("CI") != "true", reason="torch.distributed with gloo is needed")
def test_llama_split_over_two_ranks_has_the_plain_loss_and_gradients(tmp_path: Path) -> None:
    require(GLOO, "torch.distributed with gloo is needed")
    import torch.multiprocessing as mp

    # the ranks fork from one server that imported torch, transformers' Llama and this module once, instead of
    # each importing them (~5 s of CPU apiece); the server starts single-threaded, unlike pytest's xdist worker
    mp.get_context("forkserver").set_forkserver_preload([__name__, "transformers.models.llama.modeling_llama"])
    ranks = mp.start_processes(
        _worker, args=(str(tmp_path / "store"),), nprocs=TP, join=False, start_method="forkserver"
    )
    deadline = time.monotonic() + 120
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail("the two tensor-parallel ranks did not finish in 120 s")


class _Mesh:
    """A 1-D mesh of ``size`` ranks as far as the checks before any sharding look."""

    def __init__(self, size: int) -> None:
        self.ndim, self.size = 1, lambda: size


@pytest.mark.parametrize(
    ("overrides", "key"),
    [({"num_key_value_heads": 1}, "num_key_value_heads=1"), ({"intermediate_size": 129}, "intermediate_size=129")],
)
def test_a_count_the_degree_does_not_divide_is_refused_in_one_line(overrides: dict, key: str) -> None:
    with pytest.raises(UserError, match=f"{key} is not divisible by parallel.tp=2") as raised:
        tensor_parallel(_llama(num_hidden_layers=1, **overrides), _Mesh(2))  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)


def test_a_model_without_a_plan_is_refused_in_one_line() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32))
    with pytest.raises(UserError, match="^model=hf: gpt2 has no base_model_tp_plan; use parallel.tp=1$"):
        tensor_parallel(model, _Mesh(2))  # type: ignore[arg-type]
