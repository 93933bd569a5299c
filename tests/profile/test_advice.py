"""Each advice rule fires just above its threshold, stays quiet just below, and quotes its figure."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fwk.profile import advice

QUIET: dict[str, Any] = {
    "device": "cuda",
    "data_share": 0.0,
    "comm_share": 0.0,
    "fp32_compute_share": 0.0,
    "bf16_compute_share": 0.0,
    "nchw_amp_conv_share": 0.0,
    "calls_per_step": 0.0,
    "short_call_share": 0.0,
    "short_time_share": 0.0,
    "peak_memory_share": 0.0,
    "peak_memory_mb": 0.0,
    "device_memory_mb": 81920.0,
    "bf16_fast": True,
    "hardware": "NVIDIA H100, compute capability 9.0",
    "precision": "fp32",
    "memory": "none",
    "jit": "off",
    "parallel": "ddp",
    "comm_hook": "none",
    "num_workers": 0,
    "pin_memory": False,
}

# rule -> (signals just above its threshold, the same just below, what the line must name)
CASES = {
    "data_wait": ({"data_share": 0.11}, {"data_share": 0.09}, ["data wait 11%", "loader.num_workers="]),
    "communication": ({"comm_share": 0.16}, {"comm_share": 0.14}, ["communication 16%", "parallel.comm_hook=bf16"]),
    "fp32": ({"fp32_compute_share": 0.21}, {"fp32_compute_share": 0.19}, ["21%", "precision=auto"]),
    "bf16_emulated": (
        {"bf16_compute_share": 0.21, "bf16_fast": False, "precision": "bf16"},
        {"bf16_compute_share": 0.19, "bf16_fast": False, "precision": "bf16"},
        ["bf16 convolutions/matmuls 21%", "no fast bf16", "precision=auto (it picks fp16 here"],
    ),
    "channels_last": ({"nchw_amp_conv_share": 0.11}, {"nchw_amp_conv_share": 0.09}, ["11%", "channels_last=true"]),
    "small_kernels": (
        {"calls_per_step": 400, "short_time_share": 0.31, "short_call_share": 0.9},
        {"calls_per_step": 400, "short_time_share": 0.29, "short_call_share": 0.9},
        ["31%", "400 kernels per step", "jit=auto"],
    ),
    "memory": (
        {"peak_memory_share": 0.86, "peak_memory_mb": 0.86 * 81920},
        {"peak_memory_share": 0.84, "peak_memory_mb": 0.84 * 81920},
        ["86%", "memory=checkpoint"],
    ),
}


def test_nothing_over_a_threshold_gives_no_advice() -> None:
    assert advice.advise(QUIET) == []


@pytest.mark.parametrize("rule", list(CASES))
def test_rule_fires_above_and_not_below(rule: str) -> None:
    above, below, words = CASES[rule]
    fired = advice.advise({**QUIET, **above})
    assert [a.rule for a in fired] == [rule]
    line = fired[0].line
    assert re.search(r"\d", fired[0].figure), line  # the figure carries its number
    for word in words:
        assert word in line, line
    assert advice.advise({**QUIET, **below}) == []


def test_rules_respect_what_is_already_set() -> None:
    # fp32 advice only where bf16 is fast and the run asked for fp32
    assert advice.advise({**QUIET, "fp32_compute_share": 0.9, "bf16_fast": False}) == []
    assert advice.advise({**QUIET, "fp32_compute_share": 0.9, "precision": "bf16"}) == []
    assert advice.advise({**QUIET, "bf16_compute_share": 0.9, "precision": "bf16"}) == []  # fast bf16: fine
    # already checkpointing: no memory=checkpoint advice
    assert advice.advise({**QUIET, "peak_memory_share": 0.95, "memory": "checkpoint"}) == []
    # small kernels need enough of them, and are not advised when already compiled
    few = {"calls_per_step": 50, "short_time_share": 0.9}
    assert advice.advise({**QUIET, **few}) == []
    assert advice.advise({**QUIET, "calls_per_step": 400, "short_time_share": 0.9, "jit": "compile"}) == []
    # a compressing hook already on: the next rung is PowerSGD
    (comm,) = advice.advise({**QUIET, "comm_share": 0.3, "comm_hook": "bf16"})
    assert "parallel.comm_hook=powersgd" in comm.line
