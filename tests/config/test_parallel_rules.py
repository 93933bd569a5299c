"""Layouts that cannot work are one line before any process starts: degrees that do not
multiply to the world size, a degree the model does not divide, a model without a plan or a
split, a schedule that does not exist, what a layout cannot be combined with."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fwk.config.compose import compose
from fwk.config.layouts import describe, estimate
from fwk.config.validate import to_typed
from fwk.distributed.dims import Dims
from fwk.errors import UserError

GPT = ["recipe=gpt_stdlib"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([*GPT, "parallel.tp=3", "parallel.nproc_per_node=4"], "parallel degrees dp_replicate=-1 x tp=3 multiply to 3"),
        ([*GPT, "parallel=tp", "parallel.nproc_per_node=3", "train.batch_size=30"],
         "parallel.tp=3 is not allowed: expected a divisor of model.n_head=4 (1, 2, 4)"),
        ([*GPT, "parallel=pp", "parallel.nproc_per_node=4"],
         "parallel.pp=4 is not allowed: expected at most model.n_layer=2 stages in all"),
        (["parallel=tp", "parallel.nproc_per_node=2"], "parallel.tp=2 is not allowed: expected 1 with model=small_cnn"),
        (["recipe=hf_llama_stdlib", "parallel=pp", "parallel.nproc_per_node=2"],
         "parallel.pp=2 is not allowed: expected 1 with model=hf"),
        (["recipe=hf_llama_stdlib", "parallel=tp", "parallel.nproc_per_node=8", "train.batch_size=64"],
         "parallel.tp=8 is not allowed: expected a divisor of model.config.num_attention_heads=4"),
        ([*GPT, "parallel=pp", "parallel.nproc_per_node=2", "parallel.pp_schedule=foo"],
         "parallel.pp_schedule='foo' is not allowed: expected one of gpipe, 1f1b, interleaved_1f1b, zero_bubble"),
        ([*GPT, "parallel=pp", "parallel.nproc_per_node=2", "parallel.pp_schedule=interleaved_1f1b"],
         "parallel.pp_stages_per_rank=1 is not allowed: expected an integer >= 2 with pp_schedule=interleaved_1f1b"),
        ([*GPT, "parallel=pp", "parallel.nproc_per_node=2", "parallel.pp_microbatches=3"],
         "parallel.pp_microbatches=3 is not allowed: expected a divisor of the per-rank batch 32"),
        ([*GPT, "parallel=pp", "parallel.nproc_per_node=2", "parallel.pp_microbatches=1"],
         "parallel.pp_microbatches=1 is not allowed: expected at least the 2 stages with pp_schedule=1f1b"),
        ([*GPT, "parallel=pp", "parallel.pp=2", "parallel.dp_shard=2", "parallel.nproc_per_node=4"],
         "parallel.dp_shard=2 is not allowed: expected 1 with parallel.pp=2"),
        ([*GPT, "parallel=tp", "parallel.nproc_per_node=2", "jit=compile"], "jit.name='compile' is not allowed"),
        ([*GPT, "parallel=tp", "parallel.nproc_per_node=2", "precision=fp16"], "precision.name='fp16' is not allowed"),
        ([*GPT, "parallel=pp", "parallel.nproc_per_node=2", "methods=[ema]"], "methods=['ema'] is not allowed"),
    ],
)  # fmt: skip
def test_a_layout_that_cannot_work_is_one_line(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError) as err:
        to_typed(compose(overrides))
    assert str(err.value).startswith(expected) and "\n" not in str(err.value), str(err.value)


def test_the_presets_are_degrees() -> None:
    def dims(*overrides: str) -> Dims:
        return to_typed(compose([*GPT, *overrides])).dims()

    assert dims("parallel=ddp", "parallel.nproc_per_node=4") == Dims(dp_replicate=4)
    assert dims("parallel=fsdp", "parallel.nproc_per_node=4") == Dims(dp_shard=4)
    assert dims("parallel=hsdp", "parallel.nproc_per_node=2", "parallel.nnodes=2") == Dims(dp_replicate=2, dp_shard=2)
    assert dims("parallel=tp", "parallel.nproc_per_node=2") == Dims(tp=2)
    assert dims("parallel=pp", "parallel.nproc_per_node=2") == Dims(pp=2)
    assert dims("parallel=hybrid", "parallel.nproc_per_node=4", "parallel.tp=2") == Dims(tp=2, dp_shard=2)
    assert dims("parallel=hybrid", "parallel.nproc_per_node=2", "parallel.nnodes=2") == Dims(tp=2, dp_shard=2)
    assert dims("parallel.tp=2", "parallel.nproc_per_node=4") == Dims(tp=2, dp_replicate=2)  # auto: the rest is data
    assert dims() == Dims()


def test_the_memory_estimate_divides_what_each_degree_splits() -> None:
    cfg = to_typed(compose([*GPT, "model.n_layer=8", "model.n_embd=256", "parallel.nproc_per_node=4"]))
    ddp, fsdp, tp, pp = (estimate(cfg, d) for d in (Dims(dp_replicate=4), Dims(dp_shard=4), Dims(tp=4), Dims(pp=4)))
    assert ddp and fsdp and tp and pp
    assert fsdp.state == tp.state == pp.state == pytest.approx(ddp.state / 4)
    one = estimate(cfg, Dims())
    assert one and tp.activations < one.activations  # the same batch, a quarter of each block's width
    lines = describe(cfg).splitlines()
    assert lines[0] == "mesh dp_replicate=4 (data-parallel degree 4)"
    assert lines[1].startswith("memory estimate dp_replicate=4: ~") and lines[2].startswith("next best by memory: ")


def test_the_dry_run_prints_the_mesh_without_importing_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from fwk.cli import main; sys.argv = ['fwk', 'train', '--dry-run', 'recipe=gpt_stdlib', "
        "'parallel.tp=2', 'parallel.pp=2', 'parallel.nproc_per_node=4']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"FWK_RUNS": str(tmp_path),
                         "PATH": "/usr/bin:/bin"}, timeout=120)  # fmt: skip
    assert "mesh pp=2 x tp=2 (data-parallel degree 1)" in out.stdout, out.stdout + out.stderr
    assert "memory estimate pp=2 x tp=2: ~" in out.stdout and out.stdout.strip().endswith("False")
