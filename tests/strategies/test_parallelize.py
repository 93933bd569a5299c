"""parallelize.py: the one order the strategies are applied in, and what the loop asks of them."""

from __future__ import annotations

import pytest
import torch

from fwk.config.compose import compose
from fwk.config.validate import to_typed
from fwk.data.build import build_data
from fwk.distributed.group import Dist
from fwk.models.build import build_model
from fwk.strategies import jit, kernels, memory, parallel, parallelize, precision

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _strategies(overrides: list[str]) -> tuple[parallelize.Strategies, torch.nn.Module]:
    cfg = to_typed(compose(["model.channels1=4", "model.channels2=4", "model.hidden=8", *overrides]))
    model = build_model(cfg.model, build_data(cfg.data, seed=cfg.seed))
    return parallelize.Strategies(cfg, SOLO, cfg.train.batch_size), model


def test_strategies_are_applied_in_the_one_order(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def recording(owner: object, method: str, name: str) -> None:
        real = getattr(owner, method)

        def call(*args: object, **kwargs: object) -> object:
            calls.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, method, call)

    recording(kernels.Kernels, "apply", "kernels")
    recording(precision.Precision, "prepare", "precision")
    recording(memory.Memory, "apply", "memory")
    recording(jit.Jit, "wrap", "jit")
    recording(parallel, "wrap", "parallel")
    strategies, model = _strategies(["memory=checkpoint", "jit=auto"])
    raw, trained = strategies.apply(model, optimizer_floats=2.0)
    order = ["kernels", "precision", "pipeline", "tensor", "memory", "jit", "parallel"]
    assert list(parallelize.APPLY_ORDER) == order
    assert calls == [n for n in order if n not in ("pipeline", "tensor")]  # one process: nothing to split
    assert raw is model  # kernels, precision and memory work on the plain model in place
    assert trained is not raw  # jit=auto: the loop trains through the JIT's switch
    with pytest.raises(AssertionError, match="applied once"):
        strategies.apply(model, optimizer_floats=2.0)


def test_the_loop_gets_state_metrics_and_summary_from_all_of_them(said: pytest.LogCaptureFixture) -> None:
    strategies, model = _strategies(["precision=fp16", "jit=off"])
    with pytest.raises(AssertionError, match="apply"):
        strategies.parts()  # the DDP monitor watches the wrapped model: nothing before apply()
    strategies.apply(model, optimizer_floats=2.0)
    parts = strategies.parts()
    assert list(parts) == ["precision", "memory", "jit", "comm"]  # the checkpoint's keys, as before
    assert all(callable(getattr(p, "state_dict", None)) and callable(p.load_state_dict) for p in parts.values())
    summary = strategies.summary()
    assert summary["precision"] == "fp16" and summary["skipped_steps"] == 0
    assert {"memory", "jit"} <= set(summary)
    row = strategies.metrics(step=10)
    assert row["loss_scale"] == 65536.0 and row["skipped_steps"] == 0  # the fp16 scaler's columns
    assert any(line.startswith("precision=fp16") for line in said.messages)
