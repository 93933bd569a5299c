"""methods=[early_exit]: where the heads go on the small CNN, a ResNet and a GPT, the step's
weighted loss against one computed by hand, the exact threshold search against known answers
and a brute-force search, evaluation through the exits, refusals in one line, and the real
`fwk train` on digits and the GPT, resumed bit-exactly."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fwk.config.schema import MethodConfig
from fwk.errors import UserError
from fwk.methods.base import Methods
from fwk.methods.early_exit import EarlyExitConfig, at_threshold, calibrate
from fwk.models.cnn import SmallCNN
from fwk.models.exits import exit_heads, exit_logits
from fwk.models.gpt import GPT
from fwk.models.loss import CrossEntropy
from fwk.strategies.modules import last_linear
from tests.conftest import resumes_bit_exactly, run_fwk


def _methods(**settings: object) -> Methods:
    return Methods(["early_exit"], MethodConfig(early_exit=EarlyExitConfig(**settings)), max_steps=10)


def _cnn() -> SmallCNN:
    torch.manual_seed(0)
    return SmallCNN(in_channels=1, channels1=6, channels2=10, hidden=12, num_classes=5)


def _gpt(n_layer: int = 4) -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=17, block_size=8, n_layer=n_layer, n_head=2, n_embd=8)


def test_the_small_cnn_gets_one_exit_after_its_first_conv_block() -> None:
    model = _cnn()
    methods = _methods()
    methods.prepare(model, "classification", torch.rand(1, 1, 8, 8))
    heads = exit_heads(model)
    assert heads.exits == [0] and heads.depth == 2
    assert heads.heads[0].weight.shape == (5, 6)  # pooled from the first conv's 6 channels to the 5 classes
    assert model.features[1]._forward_hooks  # the ReLU after the first conv: the block's output
    assert {k for k in model.state_dict() if k.startswith("early_exits.")} == {
        "early_exits.heads.0.weight",
        "early_exits.heads.0.bias",
    }
    assert last_linear(model) == ["head.4"]  # precision's last:Linear still names the model's classifier


def test_a_resnet_gets_an_exit_after_each_stage_but_the_last_and_keeps_its_statistics() -> None:
    from fwk.models.configs import ResNet18Config
    from fwk.models.vision import resnet18

    torch.manual_seed(0)
    model = resnet18(ResNet18Config(num_classes=10, in_channels=1, small_input=True))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _methods().prepare(model, "classification", torch.rand(1, 1, 8, 8))
    heads = exit_heads(model)
    assert heads.exits == [1, 3, 5] and heads.depth == 8  # the last block of layer1, layer2, layer3
    assert [h.weight.shape[1] for h in heads.heads] == [64, 128, 256]
    assert model.layer3[1]._forward_hooks and not model.layer4[1]._forward_hooks
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # sizing the heads ran in eval mode
    assert heads.block_share() == [2 / 8, 4 / 8, 6 / 8, 1.0]


def test_a_gpt_gets_an_exit_each_quarter_sharing_its_lm_head() -> None:
    model = _gpt(n_layer=8)
    params = sum(p.numel() for p in model.parameters())
    _methods().prepare(model, "lm")
    heads = exit_heads(model)
    assert heads.exits == [1, 3, 5]
    assert all(isinstance(h, nn.LayerNorm) for h in heads.heads)
    # one LayerNorm weight (no bias) per exit and no new head matrix: the tied embedding serves every exit
    assert sum(p.numel() for p in model.parameters()) == params + 3 * 8
    assert model.lm_head.weight is model.tok_emb.weight
    assert exit_heads(_prepared_gpt(n_layer=2)).exits == [0]  # gpt_stdlib's two layers: one exit, after the first


def _prepared_gpt(n_layer: int, **settings: object) -> GPT:
    model = _gpt(n_layer)
    _methods(**settings).prepare(model, "lm")
    return model


def test_the_cnns_loss_is_the_weighted_mean_of_the_exit_and_the_final_cross_entropy() -> None:
    model = _cnn()
    methods = _methods()
    methods.prepare(model, "classification", torch.rand(1, 1, 8, 8))
    loss = methods.loss(CrossEntropy())
    torch.manual_seed(1)
    x, y = torch.rand(7, 1, 8, 8), torch.randint(0, 5, (7,))
    got = loss(model, x, y)
    head = exit_heads(model).heads[0]
    first = torch.relu(model.features[0](x))  # (7, 6, 8, 8): the first conv block's output
    exit_ce = F.cross_entropy(F.linear(first.mean(dim=(2, 3)), head.weight, head.bias), y)
    final_ce = F.cross_entropy(model(x), y)
    assert torch.allclose(got, (0.5 * exit_ce + 1.0 * final_ce) / 1.5, rtol=1e-6, atol=0)  # (i+1)/(n+1) = 1/2
    got.backward()
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


def test_the_gpts_loss_with_set_weights_and_label_smoothing_fused_or_not() -> None:
    model = _gpt(n_layer=4)
    methods = _methods(exits=[0, 2], weights=[0.2, 0.7])
    methods.prepare(model, "lm")
    loss = dataclasses.replace(methods.loss(CrossEntropy()), label_smoothing=0.1)  # as a later method would
    assert loss.weights == (0.2, 0.7) and loss.heads is exit_heads(model)  # the replace keeps the exits
    torch.manual_seed(2)
    x, y = torch.randint(0, 17, (3, 8)), torch.randint(0, 17, (3, 8))
    h = model.tok_emb(x) + model.pos_emb(torch.arange(8))
    hidden = []
    for block in model.blocks:
        h = block(h)
        hidden.append(h)
    norms = exit_heads(model).heads

    def ce(z: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(z.reshape(-1, 17), y.reshape(-1), label_smoothing=0.1)

    exits = [ce(norms[i](hidden[b]) @ model.tok_emb.weight.t()) for i, b in enumerate([0, 2])]
    final = ce(model.lm_head(model.ln_f(hidden[-1])))
    expected = (0.2 * exits[0] + 0.7 * exits[1] + final) / 1.9
    assert torch.allclose(loss(model, x, y), expected, rtol=1e-6, atol=0)
    fused = type(loss)(label_smoothing=0.1, fused=True, heads=loss.heads, weights=loss.weights)
    assert torch.allclose(fused(model, x, y), expected, rtol=1e-6, atol=0)  # through model.head_loss


def test_calibration_picks_the_largest_threshold_within_max_drop() -> None:
    # one exit, four samples: the final output is always right; the exit is wrong on the third
    entropy = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    score = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    found = calibrate(entropy, score, 0.2, False, [0.5, 1.0])
    # at 0.3 the first two leave (entropy < 0.3) and accuracy stays 1.0; above it the third leaves: 0.75
    assert found["threshold"] == 0.3 and found["with_exits"] == 1.0
    assert found["share"] == [0.5, 0.5] and found["mean_depth"] == 0.75 and found["each_exit"] == [0.75]
    loose = calibrate(entropy, score, 0.25, False, [0.5, 1.0])
    assert loose["threshold"] == math.nextafter(0.4, math.inf) and loose["share"] == [1.0, 0.0]  # all leave
    strict = calibrate(entropy, score, 0.0, False, [0.5, 1.0])
    assert strict["threshold"] == 0.3  # zero drop still lets the two right ones leave


def test_calibration_takes_the_largest_feasible_not_the_first_infeasible_and_counts_first_exits() -> None:
    # two exits, three samples. As the threshold rises, sample 0 first leaves at exit 1, where
    # it is wrong (0.2 < t), then at exit 0, where it is right (0.9 < t); sample 2 is wrong at
    # exit 0 and leaves there only above 2.0. So accuracy dips, recovers, then drops again.
    entropy = torch.tensor([[0.9, 0.5, 2.0], [0.2, 1.0, 2.0]], dtype=torch.float64)
    score = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    found = calibrate(entropy, score, 0.0, False, [1 / 3, 2 / 3, 1.0])
    assert found["threshold"] == 2.0 and found["with_exits"] == 1.0
    assert found["share"] == [2 / 3, 0.0, 1 / 3] and sum(found["share"]) == 1.0
    assert at_threshold(entropy, score, 0.5, [1 / 3, 2 / 3, 1.0])["with_exits"] == 2 / 3  # the dip


@pytest.mark.parametrize("loss", [False, True])
def test_calibration_matches_a_brute_force_search(loss: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    exits, n = 3, 200
    depth = [0.25, 0.5, 0.75, 1.0]
    max_drop = 0.05
    noise = torch.rand(exits, n, generator=gen, dtype=torch.float64)
    # shallower exits score worse, and a worse score comes with a higher entropy; quarters make ties
    if loss:
        worse = torch.tensor([[0.6], [0.4], [0.2], [0.0]], dtype=torch.float64)
        score = torch.rand(exits + 1, n, generator=gen, dtype=torch.float64) + worse
        entropy = (noise * 2 + score[:exits]).mul(4).round().div(4)
    else:
        right = torch.tensor([[0.6], [0.7], [0.8], [0.9]])
        score = (torch.rand(exits + 1, n, generator=gen) < right).double()
        entropy = (noise * 2 + (1 - score[:exits])).mul(4).round().div(4)
    candidates = sorted(set(entropy.flatten().tolist())) + [math.nextafter(entropy.max().item(), math.inf)]
    full = score[exits].mean().item()

    def ok(t: float) -> bool:
        with_exits = at_threshold(entropy, score, t, depth)["with_exits"]
        return (with_exits - full if loss else full - with_exits) <= max_drop + 1e-12  # summed in two orders

    best = max(t for t in candidates if ok(t))
    assert best < candidates[-1]  # max_drop binds: not every sample may leave at the first exit
    found = calibrate(entropy, score, max_drop, loss, depth)
    assert found["threshold"] == best
    assert sum(found["share"]) == pytest.approx(1.0, abs=1e-12)
    assert (found["with_exits"] - full if loss else full - found["with_exits"]) <= max_drop + 1e-12


def test_exit_logits_take_each_samples_first_confident_exit() -> None:
    model = _prepared_gpt(n_layer=4)
    x = torch.randint(0, 17, (2, 8))
    with torch.no_grad():
        full = model(x)
        none, taken = exit_logits(model, x, 0.0)  # entropy is never below 0: the final output
        assert torch.equal(none, full) and (taken == 3).all()
        first, taken = exit_logits(model, x, math.inf)  # every token leaves at the first exit
        assert (taken == 0).all() and not torch.allclose(first, full)


def test_an_exit_past_the_models_blocks_and_a_weight_count_that_does_not_match_are_one_line() -> None:
    with pytest.raises(UserError, match=r"^method.early_exit.exits=\[1\] is not allowed: expected block indices "):
        _methods(exits=[1]).prepare(_cnn(), "classification", torch.rand(1, 1, 8, 8))
    with pytest.raises(UserError, match=r"^method.early_exit.weights=\[0.5, 0.5\] is not allowed: expected one"):
        _methods(weights=[0.5, 0.5]).prepare(_cnn(), "classification", torch.rand(1, 1, 8, 8))
    with pytest.raises(UserError, match=r"^methods: early_exit places exits on GPT, ResNet and small-CNN models"):
        _methods().prepare(nn.Sequential(nn.Linear(2, 2)), "classification", torch.rand(1, 2))


def test_a_bad_setting_is_one_line_before_any_run_dir(runs: Path) -> None:
    out = run_fwk("train", "methods=[early_exit]", "method.early_exit.exits=[2,1]", runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "fwk: error: method.early_exit.exits=[2, 1] is not allowed: expected block indices >= 0 in increasing "
        "order (empty: automatic) (fix it with method.early_exit.exits=...)"
    )
    assert not runs.exists()


def _summary(runs: Path) -> dict:
    (run,) = runs.glob("*/")
    return json.loads((run / "summary.json").read_text())


def test_digits_train_with_an_exit_and_calibrate_within_max_drop(runs: Path) -> None:
    out = run_fwk("train", "methods=[early_exit]", "train.max_steps=80", "train.eval_every=80", "jit=off", runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "early_exit: exits after blocks 0 of 2" in out.stdout and "early_exit: threshold " in out.stdout
    summary = _summary(runs)
    found = summary["early_exit"]
    assert found["metric"] == "val_acc" and found["max_drop"] == 0.01 and found["exits"] == [0]
    assert found["full"] == summary["eval"]["val_acc"] > 0.9  # the full model's is the run's own evaluation
    assert found["full"] - found["with_exits"] <= 0.01
    assert found["eval"]["val_acc"] == pytest.approx(found["with_exits"], abs=1e-12)  # evaluate() through exits
    assert sum(found["share"]) == pytest.approx(1.0) and len(found["share"]) == 2
    assert 0.5 <= found["mean_depth"] <= 1.0
    (checkpoint,) = (next(runs.glob("*/")) / "checkpoints").glob("step-*")
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    assert state["methods"]["early_exit"]["threshold"] == found["threshold"]  # saved again after calibrating
    plain = Methods.exported(state)  # fwk export takes the model without its heads
    assert plain is not None and not any(k.startswith("early_exits.") for k in plain)
    SmallCNN(1, 32, 64, 128, 10).load_state_dict(plain)  # strict: digits_cnn's own weights, all of them


def test_gpt_stdlib_trains_briefly_with_exits(runs: Path) -> None:
    out = run_fwk(
        "train", "recipe=gpt_stdlib", "methods=[early_exit]", "model.n_embd=32", "model.n_head=2",
        "data.val_max_bytes=16384", "train.max_steps=12", "train.eval_every=12", "jit=off", runs=runs,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    found = _summary(runs)["early_exit"]
    assert found["metric"] == "val_loss" and found["max_drop"] == 0.05 and found["exits"] == [0]
    assert found["with_exits"] - found["full"] <= 0.05 + 1e-9
    assert found["eval"]["val_loss"] == pytest.approx(found["with_exits"], rel=1e-5)  # sums in another order
    assert sum(found["share"]) == pytest.approx(1.0)


def test_a_run_with_exits_stopped_mid_way_resumes_bit_exactly(tmp_path: Path) -> None:
    args = ["train", "methods=[early_exit]", "train.max_steps=20", "train.eval_every=10", "train.log_every=5"]
    args += ["jit=off", "checkpoint.every=5", "checkpoint.keep=10", "train.batch_size=16"]
    _, straight, resumed = resumes_bit_exactly(args, tmp_path, final_step=20)  # the heads' weights included
    a, b = (json.loads((run / "summary.json").read_text())["early_exit"] for run in (straight, resumed))
    assert a == b


def test_two_process_ddp_keeps_the_heads_in_sync_and_calibrates_on_the_whole_val_split(runs: Path) -> None:
    import torch.distributed as dist

    from tests.conftest import require

    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    out = run_fwk(
        "train", "methods=[early_exit]", "parallel=ddp", "parallel.nproc_per_node=2", "train.max_steps=30",
        "train.eval_every=30", "jit=off", runs=runs, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    summary = _summary(runs)
    assert summary["replicas_in_sync"] is True  # the heads are DDP's parameters too
    found = summary["early_exit"]
    assert found["full"] == summary["eval"]["val_acc"]  # both ranks' shards gathered: the same 300 samples
    assert found["eval"]["val_acc"] == pytest.approx(found["with_exits"], abs=1e-12)
