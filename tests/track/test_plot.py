"""fwk/track/plot.py: the series read from metrics.jsonl, and the PNG drawn from them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib import colormaps
from matplotlib.image import imread

from fwk.errors import UserError
from fwk.track.plot import _grid, label, load, metric_names, plot_runs, series
from tests.track.fake_runs import make_run


def test_series_reads_train_loss_and_eval_metrics_by_step(tmp_path: Path) -> None:
    run = make_run(
        tmp_path,
        "a1",
        losses=(2.3, math.nan, 1.5, 1.2),  # step 2 was NaN-skipped
        evals={2: {"val_loss": 1.8, "val_acc": 0.5}, 4: {"val_loss": math.inf, "val_acc": 0.7}},
    )
    with open(run.metrics, "a") as f:
        f.write(json.dumps({"step": 4, "kind": "train", "loss": 1.1, "lr": 1e-3, "samples_per_s": 900.0}) + "\n")
        f.write('{"step": 5, "kind": "train", "lo')  # a line the running trainer is writing
    got = series(run)
    # step 4 logged twice (a resume): the last value; lr and samples/s are not plotted
    assert got == {
        "loss": ([1, 3, 4], [2.3, 1.5, 1.1]),
        "val_loss": ([2], [1.8]),
        "val_acc": ([2, 4], [0.5, 0.7]),
    }


def test_series_of_a_run_without_rows_is_empty(tmp_path: Path) -> None:
    run = make_run(tmp_path, "a1", losses=())
    assert run.metrics.read_text() == "" and series(run) == {}
    run.metrics.unlink()
    assert series(run) == {}


def test_panels_and_labels(tmp_path: Path) -> None:
    a = make_run(tmp_path, "a1", tags=["base", "hi-lr"], evals={3: {"val_loss": 1.0, "val_acc": 0.6}})
    b = make_run(tmp_path, "b2", recipe="gpt_tiny", losses=(), evals={3: {"val_ppl": 9.0, "val_loss": 2.2}})
    curves = load([b, a])
    # train loss first (though b has none), then eval metrics as the runs first log them
    assert metric_names(curves) == ["loss", "val_ppl", "val_loss", "val_acc"]
    assert [label(a), label(b)] == ["a1 digits_cnn [base, hi-lr]", "b2 gpt_tiny"]
    # several runs: the legend names the config keys that tell them apart (tags are not config)
    c = make_run(tmp_path, "c3", lr=0.01, tags=["other"])
    labels = [x.label for x in load([a, c])]
    assert labels == ["a1 digits_cnn optim.lr=0.001 [base, hi-lr]", "c3 digits_cnn optim.lr=0.01 [other]"]
    assert [x.label for x in load([a, b])][1] == "b2 gpt_tiny"  # the recipe is there once
    assert [_grid(n) for n in (1, 2, 3, 4, 5, 7)] == [(1, 1), (1, 2), (2, 2), (2, 2), (2, 3), (3, 3)]


def _share(image: np.ndarray, rgb: tuple[float, ...]) -> float:
    """The fraction of pixels within 0.05 of ``rgb`` in every channel (line cores; edges are antialiased)."""
    return float(np.mean(np.all(np.abs(image[..., :3] - np.array(rgb[:3])) < 0.05, axis=-1)))


def test_plot_runs_draws_each_run_in_its_colour(tmp_path: Path) -> None:
    evals_a = {5: {"val_loss": 1.9, "val_acc": 0.4}, 10: {"val_loss": 1.2, "val_acc": 0.8}}
    evals_b = {5: {"val_loss": 1.6, "val_acc": 0.5}, 10: {"val_loss": 1.0, "val_acc": 0.9}}
    a = make_run(tmp_path, "a1", losses=tuple(2.3 - 0.1 * i for i in range(10)), evals=evals_a)
    b = make_run(tmp_path, "b2", losses=tuple(2.3 - 0.15 * i for i in range(10)), evals=evals_b)
    out = plot_runs([a, b], tmp_path / "plots" / "ab.png")
    assert out == tmp_path / "plots" / "ab.png"
    image = imread(out)
    # 3 panels on a 2 x 2 grid of 5 x 3.5 in, one legend row of 0.3 in + 0.2 in, at 100 dpi
    assert image.shape == (750, 1000, 4)
    tab10 = colormaps["tab10"]
    # 3 lines and a legend entry each: ~1,150 px of the line's own colour (its antialiased edges are not)
    assert _share(image, tab10(0)) > 0.0008 and _share(image, tab10(1)) > 0.0008
    assert _share(image, tab10(2)) == 0  # no third run
    assert _share(image, (1.0, 1.0, 1.0)) > 0.7  # a white page with lines on it


def test_plot_runs_leaves_out_runs_without_rows_and_refuses_when_none_has_any(tmp_path: Path) -> None:
    a = make_run(tmp_path, "a1", losses=(2.0,))
    empty = make_run(tmp_path, "e0", losses=())
    image = imread(plot_runs([a, empty], tmp_path / "one.png"))
    assert image.shape == (400, 500, 4)  # one panel, one legend row
    assert _share(image, colormaps["tab10"](0)) > 0 and _share(image, colormaps["tab10"](1)) == 0
    with pytest.raises(UserError, match="run e0 has no metrics yet"):
        plot_runs([empty], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_curves_by_training_time_or_samples_with_the_target_crossing(tmp_path: Path) -> None:
    import yaml

    from fwk.track.plot import crossing

    run = make_run(tmp_path, "a1", losses=())
    rows = [
        {"step": 10, "kind": "train", "loss": 2.0, "train_s": 1.5},
        {"step": 20, "kind": "train", "loss": 1.0, "train_s": 3.0},
        {"step": 20, "kind": "eval", "val_acc": 0.9, "train_s": 3.0},
    ]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = yaml.safe_load(run.config.read_text())
    config["train"].update(batch_size=32, accum_steps=2)
    run.config.write_text(yaml.safe_dump(config))
    run.write_summary({"final_step": 20, "eval": {}, "target": {"reached": True, "step": 20, "train_time_s": 3.1}})
    assert series(run, "time") == {"loss": ([1.5, 3.0], [2.0, 1.0]), "val_acc": ([3.0], [0.9])}
    assert series(run, "samples")["loss"] == ([640.0, 1280.0], [2.0, 1.0])  # step x batch x accumulation
    assert [crossing(run, x) for x in ("step", "time", "samples")] == [20.0, 3.1, 1280.0]
    out = plot_runs([run], tmp_path / "t.png")
    assert out.is_file()
    from fwk.track.plot import draw

    drawn = draw(load([run], "time"), tmp_path / "time.png", "time")
    assert imread(drawn).shape[2] in (3, 4)
