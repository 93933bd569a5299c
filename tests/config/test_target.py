"""`train.stop_at` targets: parsed, checked in one line, and reached or not."""

from __future__ import annotations

import pytest

from fwk.config.target import Target, parse_target
from tests.conftest import run_fwk


def test_a_target_parses_and_is_reached_on_the_right_side() -> None:
    acc = parse_target("val_acc>=0.985")
    assert acc == Target("val_acc", ">=", 0.985) and str(acc) == "val_acc>=0.985"
    assert acc.reached({"val_acc": 0.985}) and not acc.reached({"val_acc": 0.98})
    loss = parse_target(" val_loss <= 1.7 ")
    assert loss.reached({"val_loss": 1.69}) and not loss.reached({"val_loss": float("nan")})
    assert not loss.reached({"val_acc": 0.5})  # the metric was not evaluated


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("val_acc>0.9", "METRIC>=VALUE or METRIC<=VALUE, e.g. val_acc>=0.985 or val_loss<=1.7"),
        ("acc>=0.9", "a metric of fwk's evaluation (val_loss, val_ppl, val_acc), not acc"),
        ("val_loss>=1.7", "val_loss<=1.7: val_loss improves downwards"),
        ("val_acc>=high", "METRIC>=VALUE or METRIC<=VALUE, e.g. val_acc>=0.985 or val_loss<=1.7"),
    ],
)
def test_a_bad_target_is_one_line_before_any_run_dir(runs, text: str, problem: str) -> None:
    with pytest.raises(ValueError, match="^" + problem.replace("(", r"\(").replace(")", r"\)") + "$"):
        parse_target(text)
    out = run_fwk("train", f"train.stop_at={text}", runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"fwk: error: train.stop_at='{text}' is not allowed: expected {problem} (fix it with train.stop_at=...)"
    )
    assert not runs.exists()


@pytest.mark.parametrize(
    ("text", "span"),
    [("val_acc>=1.01", "[0, 1]"), ("val_loss<=-0.1", "[0, inf)"), ("val_ppl<=0.99", "[1, inf)")],
)
def test_a_target_beyond_its_metrics_range_is_unreachable(text: str, span: str) -> None:
    metric = text.partition(">")[0].partition("<")[0]
    assert parse_target(text).unreachable() == (
        f"can never be reached: {metric} lies in {span}; use a value in that range"
    )


@pytest.mark.parametrize("text", ["val_acc>=1", "val_acc>=0", "val_loss<=0", "val_ppl<=1", "val_loss<=1e9"])
def test_a_target_at_the_edge_of_the_range_can_be_reached(text: str) -> None:
    assert parse_target(text).unreachable() is None
