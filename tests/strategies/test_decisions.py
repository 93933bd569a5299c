"""Measured decisions: precision=auto from fed step times (both ways), one decision at a
time, the per-machine cache and its key, resume and replay re-applying what was decided."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fwk.config.schema import Config, JitConfig, PrecisionConfig
from fwk.distributed.group import Dist
from fwk.strategies import hardware
from fwk.strategies.auto_precision import trial_order
from fwk.strategies.decisions import Decisions
from fwk.strategies.jit import Jit
from fwk.strategies.precision import Precision

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
BF16_CPU = hardware.Features(bf16_fast=True, fp16_works=True, text="test CPU with bf16 units")
PLAIN_CPU = hardware.Features(bf16_fast=False, fp16_works=True, text="test CPU without bf16 units")


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


def _config(**precision) -> Config:
    cfg = Config()
    cfg.precision = PrecisionConfig(name="auto", probe_steps=2, trial_steps=3, **precision)
    return cfg


def _replay_orders(original: Decisions) -> dict:
    """The orders `fwk replay` writes to the run dir for its workers, read back."""
    return json.loads(json.dumps({"replay": original.records()}))


def _precision(monkeypatch, cfg: Config, features=BF16_CPU, max_steps: int = 1000, decisions=None) -> Precision:
    monkeypatch.setattr(hardware, "probe", lambda device: features)
    d = decisions if decisions is not None else Decisions(cfg, SOLO)
    p = Precision(cfg.precision, SOLO, max_steps, d)
    p.prepare(_net())
    return p


def _train(p: Precision, steps: range, ms: dict[str, float]) -> list[str]:
    """Run the loop's calls for ``steps`` with fed step times per format; the formats used."""
    used = []
    for step in steps:
        p.begin(step)
        used.append(p.format)
        p.step_done(step, ms[p.format] / 1000)
    return used


def test_the_trial_interleaves_both_formats_after_the_range_probe() -> None:
    assert trial_order("bf16", 3) == ["fp32", "bf16", "fp32", "bf16", "bf16", "fp32", "fp32", "bf16"]


@pytest.mark.parametrize(
    ("ms", "choice", "line"),
    [
        (
            {"bf16": 60.0, "fp32": 90.0},
            "bf16",
            "chose bf16: bf16 1.50x faster than fp32 (60 vs 90 ms/step, 3 steps each)",
        ),
        (
            {"bf16": 188.0, "fp32": 88.0},
            "fp32",
            "chose fp32: bf16 2.14x slower than fp32 (188 vs 88 ms/step, 3 steps each)",
        ),
        (
            {"bf16": 98.0, "fp32": 100.0},
            "fp32",
            "chose fp32: bf16 1.02x faster than fp32 (98 vs 100 ms/step, 3 steps each), less than "
            "precision.min_speedup=1.05",
        ),
    ],
    ids=["bf16-faster", "bf16-slower", "bf16-within-noise"],
)
def test_auto_keeps_the_fast_format_only_when_it_measures_faster(
    monkeypatch: pytest.MonkeyPatch,
    said: pytest.LogCaptureFixture,
    ms: dict[str, float],
    choice: str,
    line: str,
    decision_cache: Path,
) -> None:
    p = _precision(monkeypatch, _config())
    assert "timing bf16 against fp32 on steps 0-7 (3 steps each, interleaved)" in said.messages[0]
    used = _train(p, range(12), ms)
    # from the first step (no range probe: no fp16), the trial's warm-ups and pairs; then the choice
    assert used == [*trial_order("bf16", 3), choice, choice, choice, choice]
    assert said.messages[-1] == f"precision=auto {line}"
    assert p.summary()["precision"] == choice and p.decided
    (cached,) = decision_cache.glob("precision-*.json")
    record = json.loads(cached.read_text())["record"]
    assert record["choice"] == choice and record["ms"] == ms and record["trial"]["start"] == 0


def test_trial_steps_do_not_count_as_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _precision(monkeypatch, _config())
    decided = []
    for step in range(11):
        p.begin(step)
        decided.append(p.decided)
        p.step_done(step, 0.01)
    assert decided == [False] * 8 + [True] * 3  # the trial's 8 steps: memory and jit wait


def test_a_cpu_without_bf16_units_is_not_timed(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture, decision_cache: Path
) -> None:
    p = _precision(monkeypatch, _config(), features=PLAIN_CPU)
    assert (
        said.messages[0] == "precision=auto chose fp32: test CPU without bf16 units, no fast bf16 units "
        "(an emulated format is not tried)"
    )
    assert _train(p, range(12), {"fp32": 10.0}) == ["fp32"] * 12
    assert not decision_cache.exists()  # nothing was measured: nothing cached


def test_too_short_a_run_keeps_the_prior_untimed(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    p = _precision(monkeypatch, _config(), max_steps=8)
    assert said.messages[0].endswith("8 steps are too few to time bf16 against fp32")
    assert _train(p, range(8), {"bf16": 1.0}) == ["bf16"] * 8


@pytest.mark.parametrize(("max_steps", "timed"), [(160, True), (159, False)])
def test_a_trial_costing_over_its_share_of_the_run_keeps_the_prior_untimed(
    monkeypatch: pytest.MonkeyPatch,
    said: pytest.LogCaptureFixture,
    decision_cache: Path,
    max_steps: int,
    timed: bool,
) -> None:
    # 8 trial steps (two warm-ups, three pairs), redone once decided: 5% of 160 steps
    p = _precision(monkeypatch, _config(), max_steps=max_steps)
    formats = _train(p, range(12), {"bf16": 188.0, "fp32": 88.0})
    if timed:
        assert formats[:8] == ["fp32", "bf16", "fp32", "bf16", "bf16", "fp32", "fp32", "bf16"]
        assert formats[8:] == ["fp32"] * 4  # measured slower: dropped
    else:
        assert formats == ["bf16"] * 12
        assert said.messages[0] == (
            "precision=auto chose bf16: test CPU with bf16 units; untimed: the 8 trial steps, redone once "
            f"decided, would be {8 / max_steps:.0%} of this run's {max_steps} steps, over "
            "precision.max_trial_share=0.05 (a longer run times it)"
        )
        assert not decision_cache.exists()  # nothing was measured: nothing cached


def test_the_next_run_reuses_the_cached_decision_without_trial_steps(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    first = _precision(monkeypatch, _config())
    _train(first, range(12), {"bf16": 188.0, "fp32": 88.0})
    said.clear()  # the next run's lines only
    again = _precision(monkeypatch, _config())
    assert said.messages[0].startswith(
        "precision=auto chose fp32 as measured before for this model on this machine: bf16 2.14x slower than fp32"
    )
    assert _train(again, range(12), {"fp32": 1.0}) == ["fp32"] * 12  # no trial steps
    assert again.decisions.records()["precision"]["source"] == "cached"
    assert again.decisions.records()["precision"]["trial"] is None  # this run had none: a replay runs none

    redecide = Decisions(_config(), SOLO, orders={"redecide": True})  # --redecide: measured again, the cache refreshed
    fresh = _precision(monkeypatch, _config(), decisions=redecide)
    assert _train(fresh, range(12), {"bf16": 60.0, "fp32": 90.0})[-1] == "bf16"
    said.clear()
    _precision(monkeypatch, _config())
    assert said.messages[0].startswith("precision=auto chose bf16 as measured before")


def test_auto_cache_false_reads_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture, decision_cache: Path
) -> None:
    _train(_precision(monkeypatch, _config()), range(12), {"bf16": 60.0, "fp32": 90.0})
    cfg = _config()
    cfg.auto.cache = False
    said.clear()  # the second run's lines only
    p = _precision(monkeypatch, cfg)
    assert "timing bf16 against fp32" in said.messages[0]  # measured although a record exists
    _train(p, range(12), {"bf16": 188.0, "fp32": 88.0})
    (cached,) = decision_cache.glob("precision-*.json")
    assert json.loads(cached.read_text())["record"]["choice"] == "bf16"  # the first run's, untouched


def test_the_key_is_the_machine_and_the_config_it_depends_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "probe", lambda device: BF16_CPU)
    base = Decisions(_config(), SOLO).key("precision")
    assert Decisions(_config(), SOLO).key("precision") == base
    other_batch = _config()
    other_batch.train.batch_size = 32
    assert Decisions(other_batch, SOLO).key("precision") != base
    longer = _config()
    longer.train.max_steps = 5000  # how long a run is does not change its step time
    assert Decisions(longer, SOLO).key("precision") == base
    monkeypatch.setattr("torch.__version__", "0.0.0")
    assert Decisions(_config(), SOLO).key("precision") != base
    monkeypatch.undo()
    monkeypatch.setattr(hardware, "probe", lambda device: PLAIN_CPU)
    assert Decisions(_config(), SOLO).key("precision") != base
    # a later decision's key holds the choices made before it
    d = Decisions(_config(), SOLO)
    before = d.key("jit")
    d.keep("precision", {"choice": "bf16"}, "hardware")
    assert d.key("jit") != before


def test_an_unreadable_cache_entry_is_measured_again(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    _train(_precision(monkeypatch, _config()), range(12), {"bf16": 60.0, "fp32": 90.0})
    d = Decisions(_config(), SOLO)
    d.path("precision").write_text("{not json")
    said.clear()  # the second run's lines only
    _precision(monkeypatch, _config(), decisions=d)
    assert "timing bf16 against fp32" in said.messages[0]


def test_a_checkpoint_taken_mid_trial_resumes_the_same_trial(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    ms = {"bf16": 60.0, "fp32": 90.0}
    uncached = _config()
    uncached.auto.cache = False
    straight = _precision(monkeypatch, uncached)
    expected = _train(straight, range(14), ms)
    straight_last = said.messages[-1]
    first = _precision(monkeypatch, _config())
    head = _train(first, range(6), ms)
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    _train(first, range(6, 14), ms)  # the first launch went on, decided and cached (then died)
    said.clear()  # the resumed run's lines only
    resumed = _precision(monkeypatch, _config())  # finds the cache at construction ...
    resumed.load_state_dict(state)  # ... but the checkpoint's trial wins
    assert head + _train(resumed, range(6, 14), ms) == expected
    assert said.messages[-1] == straight_last


def test_a_decided_checkpoint_keeps_its_choice_on_other_hardware(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    first = _precision(monkeypatch, _config())
    _train(first, range(12), {"bf16": 60.0, "fp32": 90.0})
    cfg = _config()
    cfg.auto.cache = False
    said.clear()  # the moved run's lines only
    moved = _precision(monkeypatch, cfg, features=PLAIN_CPU)
    moved.load_state_dict(first.state_dict())
    assert said.messages[-1] == "precision=auto keeps bf16, as it decided before the checkpoint"
    assert _train(moved, range(12, 14), {"bf16": 1.0}) == ["bf16", "bf16"]


def test_a_replay_follows_the_recorded_choice_from_step_0(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    """A measured run redoes its trial steps in the chosen format (fwk/components/trials.py), so
    its result is that of the choice from step 0: what a replay, on any machine, runs."""
    original = _precision(monkeypatch, _config())
    _train(original, range(14), {"bf16": 188.0, "fp32": 88.0})
    replayed = Decisions(_config(), SOLO, orders=_replay_orders(original.decisions))
    said.clear()  # the replay's lines only
    replay = _precision(monkeypatch, _config(), features=PLAIN_CPU, decisions=replayed)  # another machine: no bf16
    assert said.messages[0].startswith("precision=auto re-applies fp32, as the replayed run decided")
    assert _train(replay, range(14), {"bf16": 1.0, "fp32": 1.0}) == ["fp32"] * 14  # no trial, no timing


def test_after_its_trial_a_measured_choice_runs_as_a_recalled_one(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    """What the loop's rewind does: the trial's steps, redone, run as a cached decision's do."""
    ms = {"bf16": 60.0, "fp32": 90.0}
    measured = _precision(monkeypatch, _config())
    before = measured.state_dict()
    assert measured.trying
    _train(measured, range(10), ms)  # the probe (2) and the trial (8): decided
    assert not measured.trying
    measured.rewind(before)
    trial = said.messages  # what the probe and the trial said
    cached = _precision(monkeypatch, _config())
    said.clear()
    redone = _train(measured, range(14), ms)
    assert trial and not set(said.messages) & set(trial)  # the redone probe's ranges are not said again
    assert redone == _train(cached, range(14), ms) == ["bf16"] * 14


def _jit(decisions: Decisions, max_steps: int = 100) -> tuple[Jit, nn.Module]:
    cfg = JitConfig(
        name="auto", backend="aot_eager", stable_steps=2, min_remaining_s=0.0, max_trial_share=0.0, trial_steps=1
    )
    jit = Jit(cfg, SOLO, max_steps, decisions=decisions)
    return jit, jit.wrap(_net())


def _jit_steps(jit: Jit, model: nn.Module, times: list[float]) -> list[str]:
    states = []
    for step, seconds in enumerate(times):
        model(torch.randn(4, 8))
        jit.step_done(step, seconds)
        states.append(jit.state)
    return states


def test_jit_reuses_cached_step_times_without_a_trial(said: pytest.LogCaptureFixture) -> None:
    cfg = _config()
    jit, model = _jit(Decisions(cfg, SOLO))
    assert _jit_steps(jit, model, [0.01, 0.01, 3.0, 0.02]) == ["eager", "trial", "trial", "off"]  # 0.5x: eager
    said.clear()  # the second run's lines only
    again, model = _jit(Decisions(cfg, SOLO))
    assert _jit_steps(again, model, [0.01, 0.01, 0.01]) == ["eager", "off", "off"]  # decided at once, no compile
    assert again.compiled is None
    assert said.messages == [
        "jit=auto stays eager, as measured before for this model on this machine (0.50x compiled, less than "
        "jit.min_speedup=1.05; --redecide measures again)"
    ]


def test_jit_replay_compiles_where_the_original_did_without_a_trial(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    cfg = _config()
    original, model = _jit(Decisions(cfg, SOLO))
    assert _jit_steps(original, model, [0.01, 0.01, 3.0, 0.005, 0.005]) == [
        "eager",
        "trial",
        "trial",
        "compiled",
        "compiled",
    ]
    records = Decisions(cfg, SOLO)
    records.keep("jit", original.record, "measured")
    said.clear()  # the replay's lines only
    replay, model = _jit(Decisions(cfg, SOLO, orders=_replay_orders(records)))
    # timings that would decide otherwise change nothing: compiled from the same step, untimed
    assert _jit_steps(replay, model, [0.01, 0.01, 9.0, 9.0, 9.0]) == [
        "eager",
        "compiled",
        "compiled",
        "compiled",
        "compiled",
    ]
    assert replay.compiled_at == original.compiled_at == 2
    assert said.messages[0].endswith(
        "compiled was 2.00x eager here before (cached), no trial; compiling from step 2 "
        "(torch.compile aot_eager, mode default)"
    )


def test_one_decision_at_a_time_precision_then_memory_then_jit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real loop's step on a tiny GPT: memory=auto's trials start only once precision's
    trial is over, and jit=auto counts stable steps only once memory has chosen."""
    from fwk.config.schema import MemoryConfig, TrainConfig
    from fwk.engine.step import TrainStep
    from fwk.models.gpt import GPT
    from fwk.models.loss import CrossEntropy
    from fwk.strategies.memory import Memory
    from fwk.strategies.step_plan import StepPlan

    monkeypatch.setattr(hardware, "probe", lambda device: BF16_CPU)
    cfg = _config()
    cfg.memory = MemoryConfig(name="auto", budget_gb=10.0)
    cfg.jit = JitConfig(name="auto", stable_steps=2, min_remaining_s=1e9)  # decides, stays eager
    d = Decisions(cfg, SOLO)
    precision = Precision(cfg.precision, SOLO, 1000, d)  # long enough for its trial
    memory = Memory(cfg.memory, SOLO, 8, d)
    jit = Jit(cfg.jit, SOLO, 40, decisions=d)
    torch.manual_seed(0)
    raw = memory.apply(precision.prepare(GPT(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16)))
    model = jit.wrap(raw)
    opt = torch.optim.SGD(raw.parameters(), lr=0.1)
    step_fn = TrainStep(
        model, opt, [precision, memory, jit], StepPlan(1, memory), CrossEntropy(), TrainConfig().grad_clip, SOLO
    )
    g = torch.Generator().manual_seed(0)
    trying = []
    for step in range(20):
        step_fn.begin(step)
        trying.append(step_fn.trying)
        step_fn(step, [(torch.randint(0, 32, (8, 16), generator=g), torch.randint(0, 32, (8, 16), generator=g))])
    assert precision.trial_end == 8  # trial steps 0-7 (bf16: no range probe before them)
    assert [s for s, _ in memory.timeline] == [8, 9, 10, 11, 12]  # a warm-up, then its 4 candidate plans
    assert jit.record is not None and jit.record["decided_at"] == 14  # 2 stable steps after memory chose
    assert list(d.records()) == ["precision", "memory", "jit"]
    assert trying == [True] * 13 + [False] * 7  # the loop redoes these (here, nothing is redone)


def _memory(cfg: Config, d: Decisions, max_steps: int | None = None):
    from fwk.strategies.memory import Memory

    return Memory(cfg.memory, SOLO, 8, d, max_steps=max_steps)


def _memory_steps(memory, steps: range) -> list[str]:
    plans = []
    for step in steps:
        memory.begin(step, turn=step >= 2)  # precision decides over steps 0-1
        plans.append(memory.plan.describe())  # the plan this step runs under
        with memory.around_step():
            pass
    return plans


@pytest.mark.parametrize(("max_steps", "timed"), [(7, True), (6, False)])
def test_memory_times_no_plans_that_the_run_would_end_amid(
    max_steps: int, timed: bool, said: pytest.LogCaptureFixture
) -> None:
    """Its turn at step 2, a warm-up and 4 plans: 5 steps, which a 7-step run has after it
    and a 6-step run does not (it keeps the plain plan, untimed, uncached, and says why)."""
    from fwk.config.schema import MemoryConfig

    cfg = _config()
    cfg.memory = MemoryConfig(name="auto", budget_gb=10.0)
    d = Decisions(cfg, SOLO)
    memory = _memory(cfg, d, max_steps=max_steps)
    plans = _memory_steps(memory, range(max_steps))
    assert [s for s, _ in memory.timeline] == ([2, 3, 4, 5, 6] if timed else [])
    assert ("memory" in d.records()) is timed
    if not timed:
        assert plans == ["none"] * 6 and not memory.trying
        assert said.messages == ["memory=auto chose none: the 4 step(s) left are too few to time its 4 plans (5 steps)"]


def test_memory_reuses_its_cached_plan_and_so_does_a_replay(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    from fwk.config.schema import MemoryConfig

    cfg = _config()
    cfg.memory = MemoryConfig(name="auto", budget_gb=10.0)
    first = _memory(cfg, Decisions(cfg, SOLO))
    plans = _memory_steps(first, range(8))
    assert [s for s, _ in first.timeline] == [2, 3, 4, 5, 6]  # its turn: a warm-up, then 4 candidate plans
    chosen = plans[-1]

    said.clear()  # the second run's lines only
    again = _memory(cfg, Decisions(cfg, SOLO))
    assert _memory_steps(again, range(8))[2:] == [chosen] * 6 and again.timeline == []  # no trials
    assert said.messages == [
        f"memory=auto chose {chosen} (as measured before for this model on this machine; auto.cache=false or "
        "--redecide measures again)"
    ]

    records = Decisions(cfg, SOLO)
    records.keep("memory", first._decision_record({}), "measured")
    said.clear()  # the replay's lines only
    replay = _memory(cfg, Decisions(cfg, SOLO, orders=_replay_orders(records)))
    assert _memory_steps(replay, range(8))[2:] == [chosen] * 6 and replay.timeline == []  # its turn: no trials
    assert said.messages == [f"memory=auto chose {chosen} (re-applied from the replayed run)"]


@pytest.mark.parametrize(
    ("ms", "layout_after"), [({"bf16": 60.0, "fp32": 90.0}, True), ({"bf16": 90.0, "fp32": 60.0}, False)]
)
def test_channels_last_follows_the_step_as_the_format_does(
    monkeypatch: pytest.MonkeyPatch, ms: dict[str, float], layout_after: bool
) -> None:
    """A conv net runs channels-last through the trial (the AMP candidate's layout), then as
    the choice asks; a cached run has the choice's layout from its first step."""
    monkeypatch.setattr(hardware, "probe", lambda device: BF16_CPU)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    p = Precision(_config().precision, SOLO, 1000, Decisions(_config(), SOLO))
    model = p.prepare(net)
    weight = model[0].weight
    layouts = []
    for step in range(12):
        p.begin(step)
        layouts.append(p.channels_last)
        p.step_done(step, ms[p.format] / 1000)
    assert layouts == [True] * 8 + [layout_after] * 4  # the trial: steps 0-7
    assert model[0].weight is weight  # converted in place: the optimizer keeps its parameters
    assert weight.is_contiguous(memory_format=torch.channels_last if layout_after else torch.contiguous_format)
    again = Precision(_config().precision, SOLO, 1000, Decisions(_config(), SOLO))
    again.prepare(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)))
    assert again.channels_last is layout_after


@pytest.mark.parametrize(
    ("plain", "fast"), [("gpt_stdlib", "gpt_stdlib_fast"), ("resnet_digits", "resnet_digits_fast")]
)
def test_a_fast_recipe_does_not_reuse_its_plain_recipes_records(plain: str, fast: str) -> None:
    """Muon, seq_warmup and another schedule change the timed step: every config key is in
    the decision's key unless it is listed as one that cannot matter (IGNORED)."""
    from fwk.config.compose import compose
    from fwk.config.validate import to_typed

    def key(*overrides: str) -> str:
        return Decisions(to_typed(compose(list(overrides))), SOLO).key("precision")

    base = key(f"recipe={plain}")
    assert key(f"recipe={fast}") != base
    assert key(f"recipe={plain}", "optim.lr=0.5") != base  # a new or changed option is in by default
    unchanged = ("seed=7", "train.eval_every=3", "train.log_every=1", "checkpoint.every=5", "train.max_steps=77")
    for override in unchanged:
        assert key(f"recipe={plain}", override) == base, override
    assert key(f"recipe={plain}", "train.stop_at=val_acc>=0.5", "tags=[a]", "auto.cache=false") == base
