"""The JIT layer: when auto compiles, new signatures, compile errors, wrapping order."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fwk.config.schema import JitConfig, MemoryConfig, PrecisionConfig, TrainConfig
from fwk.distributed.group import Dist
from fwk.engine.step import TrainStep
from fwk.models.gpt import GPT
from fwk.models.loss import CrossEntropy
from fwk.strategies.jit import Jit, _Dispatch, compile_estimate_s
from fwk.strategies.memory import Memory
from fwk.strategies.precision import Precision
from fwk.strategies.step_plan import StepPlan

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _gpt() -> nn.Module:
    torch.manual_seed(0)
    return GPT(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16)


def _tokens(n: int = 8, t: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n * 100 + t)
    return torch.randint(0, 32, (n, t), generator=g), torch.randint(0, 32, (n, t), generator=g)


def _build(jit_cfg: JitConfig, memory: str = "none", max_steps: int = 100, precision: str = "fp32"):
    """The trainer's objects in the trainer's order: precision -> memory -> jit (no DDP here)."""
    precision = Precision(PrecisionConfig(name=precision, warmup_steps=1), SOLO, max_steps)
    mem = Memory(MemoryConfig(name=memory), SOLO, 8)
    jit = Jit(jit_cfg, SOLO, max_steps)
    raw = mem.apply(precision.prepare(_gpt()))
    model = jit.wrap(raw)
    opt = torch.optim.SGD(raw.parameters(), lr=0.1)
    step = TrainStep(model, opt, [precision, mem, jit], StepPlan(1, mem), CrossEntropy(), TrainConfig().grad_clip, SOLO)
    return step, jit, raw


def test_auto_compiles_after_stable_steps_and_cpu_keeps_the_faster(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    cfg = JitConfig(
        name="auto", backend="aot_eager", stable_steps=3, min_remaining_s=0.0, max_trial_share=0.0, trial_steps=2
    )
    jit = Jit(cfg, SOLO, 100)
    model = jit.wrap(_gpt())
    x, _ = _tokens()
    fake = iter([0.010, 0.010, 0.010, 5.0, 0.020, 0.020])  # eager 10 ms; compile step; compiled 20 ms
    for step in range(6):
        model(x)
        jit.step_done(step, next(fake))
        assert jit.state == ["eager", "eager", "trial", "trial", "trial", "off"][step]
    assert said.messages == [
        "jit=auto: 3 steps with one signature; compiling from step 3 (torch.compile aot_eager, mode default)",
        "step 3: compiled in 5.0 s (the first compiled step, compile included)",
        "jit=auto goes back to eager: 20 ms/step compiled vs 10 ms eager (0.50x)",
    ]


def test_auto_keeps_compiled_when_faster_and_unsettled_steps_do_not_count(said: pytest.LogCaptureFixture) -> None:
    cfg = JitConfig(
        name="auto", backend="aot_eager", stable_steps=2, min_remaining_s=0.0, max_trial_share=0.0, trial_steps=1
    )
    jit = Jit(cfg, SOLO, 100)
    model = jit.wrap(_gpt())
    x, _ = _tokens()
    for step, (seconds, settled) in enumerate([(0.01, False), (0.01, False), (0.01, True), (0.01, True)]):
        model(x)
        jit.step_done(step, seconds, settled)
    assert said.messages[0].endswith("compiling from step 4 (torch.compile aot_eager, mode default)")  # not before
    for step, seconds in ((4, 3.0), (5, 0.005)):
        model(x)
        jit.step_done(step, seconds)
    assert jit.state == "compiled"
    assert said.messages[-1] == "jit=auto keeps compiled: 5 ms/step compiled vs 10 ms eager (2.00x)"


def test_auto_goes_back_to_eager_when_compiled_is_faster_only_within_noise(said: pytest.LogCaptureFixture) -> None:
    cfg = JitConfig(
        name="auto", backend="aot_eager", stable_steps=2, min_remaining_s=0.0, max_trial_share=0.0, trial_steps=1
    )
    jit = Jit(cfg, SOLO, 100)
    model = jit.wrap(_gpt())
    for step, seconds in enumerate([0.0100, 0.0100, 3.0, 0.0097]):  # compiled 1.03x faster: a tie
        model(_tokens()[0])
        jit.step_done(step, seconds)
    assert jit.state == "off"
    assert said.messages[-1] == (
        "jit=auto goes back to eager: 10 ms/step compiled vs 10 ms eager (1.03x, less than jit.min_speedup=1.05)"
    )


def test_auto_stays_eager_when_compiling_cannot_pay_off(said: pytest.LogCaptureFixture) -> None:
    jit = Jit(JitConfig(name="auto", stable_steps=2), SOLO, 10)
    model = jit.wrap(_gpt())
    for step in range(3):
        model(_tokens()[0])
        jit.step_done(step, 0.01)
    assert jit.state == "off" and jit.compiled is None
    assert said.messages == [
        "jit=auto stays eager: 8 steps left x 10 ms = 0 s, less than jit.min_remaining_s=60 (compiling costs)"
    ]


def test_a_cpu_trial_dearer_than_its_share_of_the_run_is_not_tried(said: pytest.LogCaptureFixture) -> None:
    """A first run (nothing cached) tries compiling only when the trial's estimated cost is at
    most max_trial_share of the eager time left; a later run that recalls the step time
    decides the same without timing anything."""
    cost = compile_estimate_s(_gpt()) + 2 * 2 * 0.01  # the compile prior and the trial's steps, twice
    assert cost == pytest.approx(6.0 + 0.45 * 21 + 0.04)  # the test GPT: 21 leaf modules
    steps_fit = round(cost / 0.05 / 0.01) + 2  # just enough steps for the trial to fit its 5%
    for max_steps, state in ((steps_fit - 10, "off"), (steps_fit + 10, "trial")):
        cfg = JitConfig(name="auto", backend="aot_eager", stable_steps=2, min_remaining_s=0.0, trial_steps=2)
        jit = Jit(
            cfg,
            SOLO,
            max_steps,
        )
        model = jit.wrap(_gpt())
        for step in range(2):
            model(_tokens()[0])
            jit.step_done(step, 0.01)
        assert jit.state == state, max_steps
    assert said.messages[0] == (
        f"jit=auto stays eager: a compile trial costs ~{cost:.0f} s here, more than jit.max_trial_share=0.05 of the "
        f"{(steps_fit - 12) * 0.01:.0f} s left (compiling pays off in longer runs)"
    )
    assert said.messages[1].startswith("jit=auto: 2 steps with one signature; compiling from step 2")
    # a later run recalls the first one's eager step time (the cache): the same verdict, untimed
    cfg = JitConfig(name="auto", backend="aot_eager", stable_steps=2, min_remaining_s=0.0, trial_steps=2)
    later = Jit(
        cfg,
        SOLO,
        steps_fit - 10,
    )
    later.cached, later._recalled = {"choice": "eager", "eager_ms": 10.0, "compiled_ms": None}, True
    model = later.wrap(_gpt())
    for step, seconds in enumerate((0.5, 0.5)):  # a busy machine: its own timings are not used
        model(_tokens()[0])
        later.step_done(step, seconds)
    assert later.state == "off" and said.messages[-1] == said.messages[0]


def test_auto_under_train_deterministic_never_compiles(said: pytest.LogCaptureFixture) -> None:
    cfg = JitConfig(name="auto", backend="aot_eager", stable_steps=1, min_remaining_s=0.0, max_trial_share=0.0)
    jit = Jit(cfg, SOLO, 100, deterministic=True)
    model = jit.wrap(_gpt())
    for step in range(3):
        model(_tokens()[0])
        jit.step_done(step, 0.01)
    assert jit.state == "off" and jit.compiled is None
    assert said.messages == [
        "jit=auto stays eager: train.deterministic=true (compiling is decided from measured step times)"
    ]


def test_a_resumed_run_keeps_the_decision_of_its_checkpoint(said: pytest.LogCaptureFixture) -> None:
    cfg = JitConfig(
        name="auto", backend="aot_eager", stable_steps=2, min_remaining_s=0.0, max_trial_share=0.0, trial_steps=1
    )
    first = Jit(cfg, SOLO, 100)
    model = first.wrap(_gpt())
    for step, seconds in enumerate([0.01, 0.01, 3.0, 0.005]):  # eager, eager, compile step, compiled faster
        model(_tokens()[0])
        first.step_done(step, seconds)
    assert first.state == "compiled"
    said.clear()  # the resumed run's lines only
    resumed = Jit(cfg, SOLO, 100)
    resumed.wrap(_gpt())
    resumed.load_state_dict(first.state_dict())
    assert resumed.state == "compiled" and resumed.compiled is not None and resumed.eager_step == 0.01
    assert said.messages == [
        "jit=auto compiled before the checkpoint; compiling again (torch.compile aot_eager, mode default)"
    ]
    # decided eager: stays eager; a checkpoint from before any decision leaves auto deciding
    said.clear()
    eager = Jit(cfg, SOLO, 100)
    eager.wrap(_gpt())
    eager.load_state_dict({"state": "off"})
    assert eager.state == "off" and said.messages == ["jit=auto stays eager, as it decided before the checkpoint"]
    fresh = Jit(cfg, SOLO, 100)
    fresh.wrap(_gpt())
    fresh.load_state_dict({"state": "eager", "eager_step": 0.0})
    assert fresh.state == "eager" and fresh.compiled is None


def test_new_signatures_recompile_up_to_the_limit_then_run_eager(said: pytest.LogCaptureFixture) -> None:
    jit = Jit(JitConfig(name="compile", backend="aot_eager", max_recompiles=1), SOLO, 100)
    model = jit.wrap(_gpt())
    for step, t in enumerate((16, 12, 8, 4)):  # four signatures; the first two compiled, the rest eager
        out = model(_tokens(t=t)[0])
        assert out.shape == (8, t, 32)
        jit.step_done(step, 0.01)
    assert len(jit.seen) == 2
    assert said.messages[2:] == [
        "jit: new input signature (8x12): compiling it too",
        "jit: more than jit.max_recompiles=1 input signatures; new ones run eager (raise jit.max_recompiles, "
        "or keep shapes fixed)",
    ]


def _broken_backend(gm, example_inputs):
    raise RuntimeError("no C++ compiler found (simulated)")


def test_a_compile_error_falls_back_to_eager_and_redoes_the_step(said: pytest.LogCaptureFixture) -> None:
    torch._dynamo.reset()
    torch._dynamo.register_backend(_broken_backend, name="fwk_test_broken")
    step, jit, raw = _build(JitConfig(name="compile", backend="fwk_test_broken"))
    reference, _, ref_raw = _build(JitConfig(name="off"))
    batch = [_tokens()]
    loss = step(0, batch)
    expected = reference(0, batch)
    assert jit.state == "off"
    assert any(m.startswith("jit: compiling failed (BackendCompilerFailed") and "simulated" in m for m in said.messages)
    assert torch.equal(loss, expected)  # redone eagerly on the same batch, once
    for a, b in zip(raw.parameters(), ref_raw.parameters(), strict=True):
        assert torch.equal(a, b)


def test_wrapping_order_checkpoint_then_compile() -> None:
    step, jit, raw = _build(JitConfig(name="compile", backend="aot_eager"), memory="checkpoint")
    assert isinstance(step.model, _Dispatch) and step.model.model is raw  # DDP would wrap this
    assert raw.blocks[0].forward.__qualname__.startswith("_checkpointed")  # checkpoint sits inside
    reference, _, ref_raw = _build(JitConfig(name="off"), memory="checkpoint")
    for i in range(2):
        torch.testing.assert_close(step(i, [_tokens()]), reference(i, [_tokens()]))
    assert len(jit.seen) == 1
    # aot_eager runs the same aten ops; only the order of a few reductions may differ
    for a, b in zip(raw.parameters(), ref_raw.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "staged", "auto"])
def test_compiled_steps_train_under_every_precision(precision: str) -> None:
    # staged over 4 steps with warmup_steps=1: fp32, then bf16 autocast (a new signature)
    step, jit, raw = _build(JitConfig(name="compile", backend="aot_eager"), max_steps=4, precision=precision)
    before = [p.detach().clone() for p in raw.parameters()]
    losses = [float(step(i, [_tokens()])) for i in range(3)]
    assert jit.state == "compiled" and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(a, b) for a, b in zip(before, raw.parameters(), strict=True))
