"""Precision: auto's choice, keep_fp32 islands, staged phases, fp16 loss scaling, range probe."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from fwk.config.schema import PrecisionConfig
from fwk.distributed.group import Dist
from fwk.errors import UserError
from fwk.strategies import hardware
from fwk.strategies.hardware import choose_format
from fwk.strategies.modules import match
from fwk.strategies.precision import Precision, check_model

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


class Recorder(nn.Module):
    """A Linear that records the dtype it computes in and whether autocast was on."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n)
        self.seen: list[tuple[torch.dtype, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((x.dtype, torch.is_autocast_enabled("cpu")))
        return self.lin(x)


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), Recorder(8), nn.ReLU(), nn.Linear(8, 4))


def _precision(monkeypatch: pytest.MonkeyPatch, bf16_fast: bool = False, max_steps: int = 1000, **cfg) -> Precision:
    features = hardware.Features(bf16_fast=bf16_fast, fp16_works=True, text="test CPU")
    monkeypatch.setattr(hardware, "probe", lambda device: features)
    return Precision(PrecisionConfig(**cfg), SOLO, max_steps)


def test_auto_is_fp32_on_a_cpu_without_bf16_units(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    p = _precision(monkeypatch, name="auto")
    p.prepare(_net())
    assert p.format == "fp32"
    assert "precision=auto chose fp32: test CPU" in said.messages[0]


def test_auto_choice_from_features() -> None:
    def f(bf16: bool, fp16: bool) -> hardware.Features:
        return hardware.Features(bf16_fast=bf16, fp16_works=fp16, text="")

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_format(f(False, True), cpu) == "fp32"
    assert choose_format(f(True, True), cpu) == "bf16"  # AMX / AVX512-BF16
    assert choose_format(f(True, True), cuda) == "bf16"  # capability >= 8.0
    assert choose_format(f(False, True), cuda) == "fp16"  # an older GPU: fp16 + loss scaling
    assert choose_format(f(False, False), cuda) == "fp32"


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "bf16_fast"), [(False, False, False), (True, False, True), (False, True, True)]
)
def test_cpu_probe_names_each_unit_yes_or_no(
    monkeypatch: pytest.MonkeyPatch, amx: bool, avx512_bf16: bool, bf16_fast: bool
) -> None:
    flags = {"amx_tile": amx, "avx512_bf16": avx512_bf16}
    monkeypatch.setattr(hardware, "_cpu_flag", lambda name: flags[name])
    monkeypatch.delenv(hardware.CPU_BF16_ENV, raising=False)
    features = hardware.probe(torch.device("cpu"))
    assert features.bf16_fast is bf16_fast
    yes = {True: "yes", False: "no"}
    assert features.text.endswith(f"AMX {yes[amx]}, AVX512-BF16 {yes[avx512_bf16]}")


@pytest.mark.parametrize("cpu_has_units", [False, True])
def test_the_environment_overrides_the_cpu_probe_both_ways(
    monkeypatch: pytest.MonkeyPatch, cpu_has_units: bool
) -> None:
    monkeypatch.setattr(hardware, "_cpu_flag", lambda name: cpu_has_units)
    cpu = torch.device("cpu")
    for value, fast in (("1", True), ("0", False)):
        monkeypatch.setenv(hardware.CPU_BF16_ENV, value)
        features = hardware.probe(cpu)
        assert features.bf16_fast is fast and f"FWK_CPU_BF16={value}" in features.text
        assert choose_format(features, cpu) == ("bf16" if fast else "fp32")
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "yes")
    with pytest.raises(UserError, match="FWK_CPU_BF16='yes' is not allowed: expected 1"):
        hardware.probe(cpu)


def test_the_suite_sees_a_pinned_cpu_probe() -> None:
    """tests/conftest.py pins the probe, so no test depends on the CPU that runs it."""
    assert os.environ[hardware.CPU_BF16_ENV] in ("0", "1")
    assert hardware.probe(torch.device("cpu")).bf16_fast is (os.environ[hardware.CPU_BF16_ENV] == "1")


def test_keep_fp32_modules_compute_in_fp32_under_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _precision(monkeypatch, name="bf16", keep_fp32=["1"])
    model = p.prepare(_net())
    p.begin(0)
    with p.autocast():
        out = model(torch.randn(2, 8))
    rec = model[1]
    assert rec.seen == [(torch.float32, False)]  # cast up, autocast off inside
    assert out.dtype == torch.bfloat16  # the layers after it are autocast again


def test_keep_fp32_by_type_name(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _precision(monkeypatch, name="bf16", keep_fp32=["Recorder"])
    model = p.prepare(_net())
    p.begin(0)
    with p.autocast():
        model(torch.randn(2, 8))
    assert model[1].seen == [(torch.float32, False)]


def test_a_typed_pattern_that_matches_nothing_names_the_closest_modules() -> None:
    cfg = PrecisionConfig(name="bf16", keep_fp32=["Recorderr"])
    with pytest.raises(UserError) as err:
        check_model(cfg, _net(), torch.device("cpu"), typed={"precision.keep_fp32"})
    assert "precision.keep_fp32: 'Recorderr' matches no module" in str(err.value)
    assert "Recorder" in str(err.value)
    check_model(cfg, _net(), torch.device("cpu"))  # not typed: a recipe's default, checked where it is used


def test_a_default_pattern_applies_where_it_matches(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    """A recipe's keep_fp32 written for its own model, on a user's model: the part that
    matches is kept, the rest is left out with one line."""
    p = _precision(monkeypatch, name="bf16", keep_fp32=["head.4", "Recorder"])
    model = p.prepare(_net())
    assert p.keep_patterns == ["Recorder"]
    assert any(
        line.startswith("precision.keep_fp32: 'head.4' (the recipe's default) matches no module of Sequential")
        for line in said.messages
    )
    p.begin(0)
    with p.autocast():
        model(torch.randn(2, 8))
    assert model[1].seen == [(torch.float32, False)]  # Recorder still runs in fp32


def test_role_patterns_name_a_module_by_type_and_place() -> None:
    net = _net()  # 0 Linear, 1 Recorder (1.lin: Linear), 2 ReLU, 3 Linear
    assert list(match(net, ["last:Linear"], "k")) == ["3"]
    assert list(match(net, ["first:Linear"], "k")) == ["0"]
    assert list(match(net, ["last:Recorder", "ReLU"], "k")) == ["1", "2"]
    assert list(match(net, ["Rec*", "*LU"], "k")) == ["1", "2"]  # globs on type names: *Norm for any norm
    with pytest.raises(UserError, match="'last:Conv2d' matches no module"):
        match(net, ["last:Conv2d"], "k")


def test_staged_phases_switch_at_the_configured_steps(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    # 20 steps: warm-up 0-1 (fp32), main 2-17 (bf16, keep_fp32 honoured), final 18-19 (last Linear fp32)
    p = _precision(
        monkeypatch, max_steps=20, name="staged", dtype="bf16", warmup_frac=0.1, final_frac=0.1, keep_fp32=["1"]
    )
    model = p.prepare(_net())
    seen = {}
    for step in range(20):
        p.begin(step)
        with p.autocast():
            hidden = model[0](torch.randn(2, 8))
            out = model(torch.randn(2, 8))
        seen[step] = (hidden.dtype, out.dtype, p.metrics()["phase"])
    assert seen[0] == seen[1] == (torch.float32, torch.float32, "warmup")
    assert all(seen[s] == (torch.bfloat16, torch.bfloat16, "main") for s in range(2, 18))
    assert seen[18] == seen[19] == (torch.bfloat16, torch.float32, "final")  # last Linear back in fp32
    assert all(dtype == torch.float32 for dtype, _ in model[1].seen)  # keep_fp32 in every phase
    assert [m for m in said.messages if "phase" in m] == [
        "step 2: precision phase warmup -> main (bf16 autocast)",
        "step 18: precision phase main -> final (bf16, final layers fp32)",
    ]


def test_staged_phase_follows_the_step_on_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _precision(monkeypatch, max_steps=20, name="staged", dtype="bf16", warmup_steps=5, final_frac=0.25)
    p.prepare(_net())
    p.begin(16)  # a run resumed in the final phase starts there
    assert p.phase == "final" and p.amp_on
    assert p.compute_dtype() == torch.bfloat16  # what Muon's Newton-Schulz step runs in
    p.begin(0)
    assert p.phase == "warmup" and p.compute_dtype() == torch.float32


def test_fp16_inf_gradient_skips_the_step_and_lowers_the_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _precision(monkeypatch, name="fp16", init_scale=1024.0)
    model = p.prepare(_net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [t.clone() for t in model.parameters()]
    p.begin(0)
    with p.autocast():
        loss = model(torch.randn(2, 8)).float().sum() * float("inf")  # an injected inf
    p.scale_loss(loss).backward()
    p.unscale(opt)  # before clipping
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert p.optimizer_step(opt)  # the scaler steps, not the caller
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=False))  # skipped
    assert p.metrics() == {"loss_scale": 512.0, "skipped_steps": 1}  # backoff 0.5

    opt.zero_grad()
    p.begin(1)
    with p.autocast():
        loss = model(torch.randn(2, 8)).float().sum()
    p.scale_loss(loss).backward()
    assert p.optimizer_step(opt)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=False))  # a clean step updates
    assert p.summary() == {"precision": "fp16", "skipped_steps": 1}

    restored = _precision(monkeypatch, name="fp16", init_scale=1024.0)
    restored.prepare(_net())
    restored.load_state_dict(p.state_dict())
    assert restored.metrics() == p.metrics()


def test_auto_under_fp16_moves_hot_modules_to_fp32(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    # An older CUDA GPU would get fp16; here the format is forced, the probe is real.
    monkeypatch.setattr("fwk.strategies.precision.choose_format", lambda features, device: "fp16")
    p = _precision(monkeypatch, name="auto", probe_steps=2, fp16_headroom=16.0)
    model = p.prepare(_net())
    with torch.no_grad():
        model[3].weight.mul_(1e5)  # its outputs reach ~1e5: past fp16's 65504
    for step in range(4):
        p.begin(step)
        # probe steps run in fp32, so the ranges are true; then the trial: fp32 and fp16 warm-ups
        assert (p.format, p.amp_on) == [("fp16", False), ("fp16", False), ("fp32", False), ("fp16", True)][step]
        with p.autocast():
            out = model(torch.randn(4, 8))
        p.scale_loss(out.float().mean() * 1e-6).backward()  # small gradients: only the activation is hot
    assert p.ranges["3"][0] > 65504 / 16
    assert p.ranges["0"][0] < 65504 / 16
    assert said.messages[-1].endswith("1 module(s) above 4094 join keep_fp32: 3")
    with p.autocast():
        assert model(torch.randn(2, 8)).dtype == torch.float32  # module 3 now runs in fp32
        assert model[0](torch.randn(2, 8)).dtype == torch.float16


@pytest.mark.parametrize("bf16_fast", [False, True], ids=["fp32-only", "bf16"])
def test_auto_probes_ranges_only_where_fp16_may_run(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture, bf16_fast: bool
) -> None:
    """The ranges only pick fp16's fp32 modules: without fp16 no hook runs, and fp32 alone is
    decided from step 0 (the next decision need not wait out probe_steps)."""
    p = _precision(monkeypatch, bf16_fast=bf16_fast, name="auto", probe_steps=3)
    model = p.prepare(_net())
    assert p.probe_done and p._probe is None and p.ranges == {}
    assert not any(m._forward_hooks for m in model.modules())
    assert p.decided is (not bf16_fast)  # bf16 is still timed against fp32, after the probe's steps
    assert not any("ranges over" in line for line in said.messages)


def test_fp16_on_a_device_without_it_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from fwk.config.compose import compose
    from fwk.config.validate import to_typed
    from fwk.strategies.preflight import preflight

    no_fp16 = hardware.Features(bf16_fast=False, fp16_works=False, text="an old GPU")
    monkeypatch.setattr(hardware, "probe", lambda device: no_fp16)
    with pytest.raises(UserError) as err:
        preflight(to_typed(compose(["precision=fp16"])))
    assert str(err.value) == "precision fp16 is not supported on an old GPU; use precision=bf16, fp32 or auto"
    preflight(to_typed(compose(["precision=bf16"])))  # other formats pass


def test_an_island_around_the_head_covers_the_models_head_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    # kernels' fused cross-entropy computes the GPT's lm_head inside head_loss, not through
    # lm_head's forward: keep_fp32=[lm_head] (the recipes' last:Linear) must still hold there
    from fwk.models.gpt import GPT

    seen: list[tuple[torch.dtype, bool]] = []

    def head_loss(hidden, weight, targets, label_smoothing=0.0):  # as kernels installs it
        logits = hidden @ weight.t()
        seen.append((logits.dtype, torch.is_autocast_enabled("cpu")))
        return nn.functional.cross_entropy(logits.float(), targets)

    for keep, expected in ((["lm_head"], (torch.float32, False)), (["blocks.0"], (torch.bfloat16, True))):
        torch.manual_seed(0)
        model = GPT(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)
        model.head_loss = head_loss
        p = _precision(monkeypatch, name="bf16", keep_fp32=keep)
        model = p.prepare(model)
        p.begin(0)
        idx = torch.randint(0, 16, (2, 8))
        with p.autocast():
            loss = model(idx, targets=idx)
        assert seen.pop() == expected, keep
        assert loss.dtype == torch.float32
