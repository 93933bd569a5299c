"""Exports that carry a run's exits (fwk/export/exits.py): the cut model against evaluation
through the exits on the small CNN, a ResNet and a GPT, at thresholds that send the batch out
at each exit; the batched rule; the program torch.export, AOTInductor and ONNX make of it;
and the real `fwk export` of a digits run trained with methods=[early_exit]."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from fwk.errors import UserError
from fwk.export import capture
from fwk.export.exits import ExitModel, check_onnx_flags, exit_model
from fwk.export.fold import fold
from fwk.models.cnn import SmallCNN
from fwk.models.exits import attach, entropy, exit_logits, exit_outputs
from fwk.models.gpt import GPT
from tests.conftest import run_fwk


def _resnet() -> nn.Module:
    model = torchvision.models.resnet18(num_classes=5)
    model.conv1 = nn.Conv2d(1, 64, 3, 1, 1, bias=False)  # the small-input stem of model=resnet18
    model.maxpool = nn.Identity()
    return model


MODELS = {  # a model with its exits' heads attached, and a batch of its inputs
    "cnn": (lambda: SmallCNN(1, 6, 10, 12, 5), lambda: torch.randn(6, 1, 8, 8)),
    "resnet": (_resnet, lambda: torch.randn(6, 1, 8, 8)),
    "gpt": (
        lambda: GPT(vocab_size=17, block_size=8, n_layer=4, n_head=2, n_embd=8),
        lambda: torch.randint(0, 17, (6, 8)),
    ),
}


def _with_heads(name: str) -> tuple[nn.Module, torch.Tensor]:
    """The model with heads whose largest entropy on ``x`` falls with depth: 0.8, 0.5, 0.2 of the most
    there is (each head's weight scaled, by bisection), so that a threshold can pick each exit."""
    torch.manual_seed(0)
    build, inputs = MODELS[name]
    model, x = build().eval(), inputs()
    heads = attach(model, [], x[:1])
    n = len(heads.exits)
    with torch.no_grad():
        for i, head in enumerate(heads.heads):
            weight, most = head.weight.clone(), None
            lo, hi = -6.0, 6.0  # log10 of the scale
            for _ in range(40):
                mid = (lo + hi) / 2
                head.weight.copy_(weight * 10**mid)
                z = exit_outputs(model, x)[i]
                most = math.log(z.shape[-1])
                lo, hi = (mid, hi) if entropy(z).max().item() > most * (0.8 - 0.6 * i / max(n - 1, 1)) else (lo, mid)
    return model, x


def _thresholds(model: nn.Module, x: torch.Tensor) -> list[float]:
    """Thresholds that send the batch out nowhere, out at each exit after the first in turn, at
    the first, and one that some rows are below at the first exit and some not."""
    with torch.no_grad():
        entropies = [entropy(z) for z in exit_outputs(model, x)[:-1]]
    worst = [e.max().item() for e in entropies]  # the batch leaves at exit i above worst[i]
    assert worst == sorted(worst, reverse=True)  # the sharper heads come deeper (_with_heads)
    between = [(worst[i] + worst[i - 1]) / 2 for i in range(1, len(worst))]
    return [-1.0, *between, worst[0] + 1.0, entropies[0].median().item()]


@pytest.mark.parametrize("name", list(MODELS))
def test_the_cut_model_is_evaluation_through_the_exits_for_a_batch_and_each_row(name: str) -> None:
    model, x = _with_heads(name)
    for threshold in _thresholds(model, x):
        cut = exit_model(model, threshold, x[:2])  # refuses a cut that is not the model's own forward
        with torch.no_grad():
            for rows in (x, *x.split(1)):
                want, taken = exit_logits(model, rows, threshold)
                torch.testing.assert_close(cut(rows), want, rtol=0, atol=1e-5)
            never = ExitModel(model, -1.0, x[:2])(x)
            torch.testing.assert_close(never, model(x).float(), rtol=0, atol=1e-5)  # the whole model, cut
            _, taken = exit_logits(model, x, threshold)
            alone = taken.reshape(len(x), -1)
            exits = len(cut.parts)
            # a row alone leaves at the first exit where every token of it is below the threshold
            below = torch.stack(
                [(entropy(z).double() < threshold).reshape(len(x), -1).all(-1) for z in exit_outputs(model, x)[:-1]]
            )
            expected = torch.where(below.any(0), below.int().argmax(0), exits)
            assert cut.stops(x) == expected.tolist()
            assert cut.alone(x) == torch.bincount(expected, minlength=exits + 1).tolist()
            if name != "gpt":
                assert cut.stops(x) == alone.squeeze(-1).tolist()  # one sample: its own exit


def test_the_whole_batch_leaves_only_when_every_row_is_below_the_threshold() -> None:
    model, x = _with_heads("cnn")
    with torch.no_grad():
        (first, final) = exit_outputs(model, x)
    e = entropy(first)
    threshold = e.median().item()  # some rows are below, some are not
    cut = exit_model(model, threshold, x[:2])
    ran: list[str] = []
    cut.rest.register_forward_hook(lambda *_: ran.append("rest"))
    with torch.no_grad():
        out = cut(x)
        assert ran == ["rest"]  # the batch ran on: not every row was confident
        torch.testing.assert_close(out, torch.where((e < threshold)[:, None], first, final))
        easy = x[e < threshold]
        cut(easy)
        assert ran == ["rest"]  # every row of this batch left at the exit: the rest never ran


def test_folding_an_exit_model_folds_every_batchnorm_of_its_parts() -> None:
    model, x = _with_heads("resnet")
    cut = exit_model(model, _thresholds(model, x)[1], x[:2])
    folded = fold(cut)
    assert folded.norms_before == 20 and folded.norms_after == 0
    with torch.no_grad():
        torch.testing.assert_close(folded.model(x), cut(x), rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt", "resnet"])
def test_the_exported_program_branches_once_per_exit_and_matches_at_every_threshold(name: str, tmp_path: Path) -> None:
    model, x = _with_heads(name)
    task = "lm" if name == "gpt" else "classification"
    for threshold in _thresholds(model, x):
        cut = fold(exit_model(model, threshold, x[:2])).model
        program = capture.capture(cut, x[:2], task, tmp_path / "log", "a pt2 program")
        conds = [n for n in program.graph.nodes if n.target is torch.ops.higher_order.cond]
        assert len(conds) == len(cut.parts)  # one per exit after the first, and one for the rest
        torch.export.save(program, tmp_path / "m.pt2")
        loaded = torch.export.load(tmp_path / "m.pt2").module()
        with torch.no_grad():
            for rows in (x, *x.split(1)):
                torch.testing.assert_close(loaded(rows), cut(rows), rtol=0, atol=1e-5)


def test_aoti_compiles_the_branches_of_a_conv_net_right(tmp_path: Path) -> None:
    """Inductor's channels-last layout broke cond branches that read a conv's output (torch 2.14)."""
    from fwk.export.formats.aoti import Aoti

    model, x = _with_heads("resnet")
    threshold = _thresholds(model, x)[1]  # the batch leaves at the second exit: one branch runs
    cut = fold(exit_model(model, threshold, x[:2])).model
    program = capture.capture(cut, x[:2], "classification", tmp_path / "log", "an aoti program")
    Aoti().save(program, tmp_path, tmp_path / "log")
    compiled = torch._inductor.aoti_load_package(str(tmp_path / "model.aoti.pt2"))
    with torch.no_grad():
        assert cut.stops(x[:1]) == [1]
        for rows in (x, x[:1]):
            torch.testing.assert_close(compiled(rows), cut(rows), rtol=0, atol=1e-4)


def test_a_forward_the_cut_parts_do_not_match_is_one_line() -> None:
    model, x = _with_heads("cnn")
    model.forward = lambda inp: model.head(model.features(inp)) * 2  # not its blocks in order
    with pytest.raises(UserError, match=r"^cannot export the exits of this SmallCNN: .* pass --no-exits"):
        exit_model(model, 1.0, x[:2])


@pytest.mark.parametrize(
    ("prune", "quantize", "qat", "flag"),
    [("magnitude", "none", 0, "--prune"), ("none", "none", 10, "--qat-steps"), ("none", "int8", 0, "--quantize int8")],
)
def test_onnx_stages_that_cannot_take_the_branches_are_refused(prune: str, quantize: str, qat: int, flag: str) -> None:
    with pytest.raises(UserError, match=rf"^{flag} .*; pass --no-exits"):
        check_onnx_flags(prune, quantize, qat)
    check_onnx_flags("none", "fp16", 0)  # fp16 converts the branches too


@pytest.fixture(scope="module")
def exit_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("exits") / "runs"
    out = run_fwk("train", "methods=[early_exit]", "train.max_steps=80", "train.eval_every=80", "jit=off", runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    return runs


def _reports(runs: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in runs.glob(f"*/exports/*/{name}")]


def test_a_pt2_export_carries_the_exits_and_the_threshold_and_runs_them_without_fwk(exit_run: Path) -> None:
    from fwk.export.reload import loader
    from fwk.export.source import load
    from fwk.track.lookup import find_run

    out = run_fwk("export", "--format", "pt2", runs=exit_run)
    assert out.returncode == 0, out.stdout + out.stderr
    (report,) = _reports(exit_run, "weights_report.json")
    summary = json.loads(next(exit_run.glob("*/summary.json")).read_text())["early_exit"]
    exits = report["exits"]
    assert exits["after_blocks"] == [0] and exits["blocks"] == 2 and exits["threshold"] == summary["threshold"]
    assert sum(exits["held_out_alone_leave_at"]) == report["held_out"] == 8
    assert report["passed"] and report["max_abs_diff"] <= 1e-5
    assert "exits after blocks 0 of 2, entropy threshold" in out.stdout
    source = load(find_run(exit_run, None), carry_exits=True)
    assert source.exits == {k: v for k, v in exits.items() if k != "held_out_alone_leave_at"}
    (run,) = [p for p in exit_run.iterdir() if p.is_dir()]
    program = loader("pt2", next(run.glob("exports/*/model.pt2")))
    x = torch.stack([torch.as_tensor(source.data.val[i][0]) for i in range(40)])
    plain = load(find_run(exit_run, None)).model  # the run's model without its heads
    with torch.no_grad():
        want = source.model(x)
        torch.testing.assert_close(program(x), want, rtol=0, atol=1e-5)
        for i in range(len(x)):
            torch.testing.assert_close(program(x[i : i + 1]), want[i : i + 1], rtol=0, atol=1e-5)
        left = torch.tensor(source.model.stops(x)) == 0
        assert 0 < int(left.sum()) < len(x)  # some samples leave at the exit, some run the whole model
        torch.testing.assert_close(want[~left], plain(x[~left]), rtol=0, atol=1e-5)


def test_an_onnx_export_carries_the_exits_in_fp32_and_no_exits_exports_the_plain_model(exit_run: Path) -> None:
    out = run_fwk("export", "--quantize", "int8", runs=exit_run)
    assert out.returncode == 2 and out.stderr.startswith("fwk: error: --quantize int8 is calibrated on the main graph")
    assert len(out.stderr.strip().splitlines()) == 1 and not _reports(exit_run, "export_report.json")
    out = run_fwk("export", "export.val_batches=1", "export.iterations=2", runs=exit_run)
    assert out.returncode == 0, out.stdout + out.stderr
    (report,) = _reports(exit_run, "export_report.json")
    assert report["quantize"] == "none" and report["final"] == "fp32.onnx"  # int8 is not the default with exits
    assert report["exits"]["after_blocks"] == [0] and sum(report["exits"]["held_out_alone_leave_at"]) > 0
    assert "exits after blocks 0 of 2" in out.stdout
    out = run_fwk("export", "--no-exits", "export.val_batches=1", "export.iterations=2", runs=exit_run)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--no-exits exports the model without them" in out.stdout
    plain = [r for r in _reports(exit_run, "export_report.json") if r["exits"] is None]
    assert len(plain) == 1 and plain[0]["quantize"] == "int8"


def test_formats_without_exits_say_they_leave_them_out(exit_run: Path) -> None:
    out = run_fwk("export", "--format", "safetensors", runs=exit_run)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--format safetensors exports the model without them" in out.stdout
    (report,) = [r for r in _reports(exit_run, "weights_report.json") if r["format"] == "safetensors"]
    assert "exits" not in report
