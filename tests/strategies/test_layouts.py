"""Tensor and pipeline parallel compute what one process computes: on 2 gloo processes, a
tp=2 step and a pp=2 step under every schedule give the one-process loss and every
gradient within 1e-5 (fp32: only the order of the sums differs), clipping included.

Both ranks build the whole model from one seed with dropout 0 (DTensor has no RNG tracker
on CPU, so dropout would differ per rank), then split it the way the run does
(``fwk/strategies/pipeline.py``, ``tensor.py``)."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from fwk.config.schema import ParallelConfig
from fwk.distributed import mesh
from fwk.distributed.collectives import clip_grad_norm_
from fwk.distributed.dims import Dims
from fwk.models.gpt import GPT
from tests.conftest import require

LAYOUTS = [
    ("tp", Dims(tp=2), {}),
    ("gpipe", Dims(pp=2), {"pp_schedule": "gpipe"}),
    ("1f1b", Dims(pp=2), {"pp_schedule": "1f1b"}),
    ("interleaved_1f1b", Dims(pp=2), {"pp_schedule": "interleaved_1f1b", "pp_stages_per_rank": 2}),
    ("zero_bubble", Dims(pp=2), {"pp_schedule": "zero_bubble", "pp_stages_per_rank": 2}),
]
TOL = 1e-5  # fp32; the sums run in another order (split matmuls, micro-batches)


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=61, block_size=16, n_layer=4, n_head=4, n_embd=32, dropout=0.0)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 61, (8, 16), generator=g), torch.randint(0, 61, (8, 16), generator=g)


def _reference(clip: float) -> tuple[float, dict[str, torch.Tensor], float]:
    """Two pieces of 4 rows each, weighted by their share of the targets (TrainStep's way)."""
    model = _model()
    x, y = _batch()
    total = 0.0
    for xs, ys in zip(x.chunk(2), y.chunk(2), strict=True):
        logits = model(xs)
        loss = F.cross_entropy(logits.flatten(0, 1), ys.flatten()) * 0.5
        loss.backward()
        total += loss.item()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}, norm


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _check(name: str, loss: float, grads: dict[str, torch.Tensor], norm: float, ref: tuple) -> None:
    ref_loss, ref_grads, ref_norm = ref
    assert abs(loss - ref_loss) < TOL, f"{name}: loss {loss} vs {ref_loss}"
    assert abs(norm - ref_norm) < TOL * max(1.0, ref_norm), f"{name}: norm {norm} vs {ref_norm}"
    for key, grad in grads.items():
        diff = (grad - ref_grads[key]).abs().max().item()
        assert diff < TOL, f"{name}: {key} gradient differs by {diff}"


def _one_layout(name: str, dims: Dims, settings: dict, ref: tuple, clip: float) -> None:
    from fwk.strategies import pipeline, tensor

    root = mesh.build(dims, torch.device("cpu"))
    model = _model()
    x, y = _batch()
    loss = 0.0
    if dims.pp > 1:
        cfg = ParallelConfig(name="pp", pp=2, pp_microbatches=2, **settings)
        pipe = pipeline.Pipeline(pipeline.split(model, cfg, dims, dist.get_rank()), cfg, dims, root)
        for xs, ys in zip(x.chunk(2), y.chunk(2), strict=True):
            loss += 0.5 * pipe.piece(xs, ys, 0.5, torch.device("cpu")).item()  # its mean, as TrainStep weighs it
        pipe.grads_ready()
        params, across, part, uncounted = list(pipe.part.parameters()), (pipe.group,), pipe.part, pipe.uncounted()
    else:
        tensor.apply(model, root["tp"])
        for xs, ys in zip(x.chunk(2), y.chunk(2), strict=True):
            piece = F.cross_entropy(model(xs).flatten(0, 1), ys.flatten()) * 0.5
            piece.backward()
            loss += piece.item()
        params, across, part, uncounted = list(model.parameters()), (), model, []
    norm = clip_grad_norm_(params, clip, across, uncounted).item()
    grads = {n: _whole(p.grad) for n, p in part.named_parameters()}
    _check(name, loss, grads, norm, ref)


def _worker(rank: int, port: int, clip: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    # a short collective timeout: a pipeline that hangs fails fast instead of holding the suite
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        ref = _reference(clip)
        for name, dims, settings in LAYOUTS:
            _one_layout(name, dims, settings, ref, clip)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("clip", [1e9, 0.05], ids=["no-clip", "clipped"])
def test_tp_and_every_pipeline_schedule_equal_one_process(clip: float) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    torch.multiprocessing.spawn(_worker, args=(_free_port(), clip), nprocs=2, join=True)
