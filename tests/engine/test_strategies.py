"""Every recipe trains a few steps with every precision and every memory option (tiny sizes)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fwk.config.compose import compose
from fwk.config.validate import to_typed
from fwk.engine.assemble import build_run
from fwk.engine.trainer import train
from fwk.track.store import RunDir

TINY = {
    "digits_cnn": ["model.channels1=4", "model.channels2=8", "model.hidden=16", "train.batch_size=16"],
    "gpt_stdlib": [
        "model.n_layer=2",
        "model.n_embd=32",
        "model.n_head=2",
        "model.block_size=16",
        "data.seq_len=16",
        "data.max_bytes=20000",
        "data.val_max_bytes=4096",
        "train.batch_size=4",  # 64 rows of tokens: each runs a Triton program, interpreted on CPU
    ],
    "resnet50_imagenet": [
        "data=synthetic",
        "data.image_size=32",
        "data.num_train=32",
        "data.num_val=8",
        "data.num_classes=10",
        "model.num_classes=10",
        "train.batch_size=8",
        "loader.num_workers=0",
    ],
}
COMMON = ["train.max_steps=3", "train.log_every=1", "train.eval_every=0", "train.eval_batches=1"]
# staged over 3 steps: warm-up (fp32) at step 0, main (AMP) at 1, final at 2
OPTIONS = [
    ["precision=fp32"],
    ["precision=bf16"],
    ["precision=fp16"],
    ["precision=staged", "precision.warmup_steps=1", "precision.final_frac=0.34"],
    ["precision=auto", "precision.probe_steps=2"],
    ["memory=checkpoint"],
    ["memory=offload"],
    ["memory=microbatch", "memory.micro_batches=2"],
    ["memory=auto", "memory.budget_gb=100"],
    ["kernels=triton"],  # Triton's interpreter on CPU (tests/conftest.py): norms and the GPT's head loss
    # compile from the first step; aot_eager traces and partitions like inductor, without codegen
    [
        "jit=compile",
        "jit.backend=aot_eager",
        "precision=staged",
        "precision.warmup_steps=1",
        "precision.final_frac=0.34",
    ],
]


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o[0])
@pytest.mark.parametrize("recipe", list(TINY))
def test_recipe_trains_with_option(recipe: str, option: list[str], tmp_path: Path) -> None:
    cfg = to_typed(compose([f"recipe={recipe}", *TINY[recipe], *COMMON, *option]))
    summary = train(build_run(cfg, RunDir(tmp_path)))
    assert summary is not None and summary["final_step"] == 3
    assert math.isfinite(summary["eval"]["val_loss"])
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len([r for r in rows if '"kind": "train"' in r]) == 3
    if option[0] in ("precision=bf16", "precision=fp16", "precision=fp32"):
        assert summary["precision"] == option[0].split("=")[1]
    if "precision=staged" in option:
        assert all(f'"phase": "{phase}"' in row for row, phase in zip(rows, ["warmup", "main", "final"], strict=False))
    memory = {"memory=checkpoint": "checkpoint", "memory=offload": "offload", "memory=microbatch": "microbatch x2"}
    if option[0] in memory:
        assert summary["memory"] == memory[option[0]]
