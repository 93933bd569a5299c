"""The loaders: exact resume with persistent workers, evaluation's workers, one-line
load errors, and loader=auto in whole runs (its plan alone: test_loader_plan.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from fwk.config.schema import LoaderConfig
from fwk.data.loader import LoadError, TrainLoader, val_loader
from fwk.data.loader_plan import Host, LoaderPlan, decide
from tests.conftest import run_fwk
from tests.data.test_imagefolder import build, write_tree

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")

AUTO = LoaderConfig()


def test_evaluation_keeps_its_workers_only_when_asked():
    rates = {0: 1.0, 3: 5.0, 4: 4.0}.__getitem__
    kept, why = decide(LoaderConfig(persistent_workers="true"), Host(4, 1, cuda=False), False, rates)
    assert kept.persistent_workers and kept.val_persistent_workers and "persistent workers on (" in why
    val = list(range(10))
    auto = LoaderPlan(num_workers=2, prefetch_factor=2, persistent_workers=True)
    assert val_loader(val, 4, 0, 1, auto).persistent_workers is False
    assert val_loader(val, 4, 0, 1, kept).persistent_workers is True
    once = val_loader(val, 4, 0, 1, auto)
    for _ in range(2):  # two evaluations, each with its own workers
        assert [b.tolist() for b in once] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


class _Unreadable(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        raise LoadError(f"item {index}: unreadable: fix it")


def test_a_load_error_in_a_worker_is_its_one_line():
    loader = torch.utils.data.DataLoader(_Unreadable(), batch_size=2, num_workers=1)
    with pytest.raises(LoadError) as err:
        next(iter(loader))
    assert str(err.value) == "item 0: unreadable: fix it"  # not torch's "Caught LoadError in ..." and its traceback


def _batches(loader: TrainLoader, count: int) -> list[torch.Tensor]:
    it = iter(loader)
    return [next(it)[0] for _ in range(count)]


def test_persistent_workers_resume_exactly_across_epochs(tmp_path):
    train = build(write_tree(tmp_path / "t"), seed=5).train  # 12 items, batch 4: 3 batches an epoch
    plan = LoaderPlan(num_workers=2, prefetch_factor=2, persistent_workers=True)
    straight = _batches(TrainLoader(train, 4, 0, 1, 5, plan), 8)
    in_process = _batches(TrainLoader(train, 4, 0, 1, 5, LoaderPlan()), 8)
    assert all(torch.equal(a, b) for a, b in zip(straight, in_process, strict=True))
    assert not torch.equal(straight[0], straight[3])  # epoch 1 reshuffles and recrops
    first = TrainLoader(train, 4, 0, 1, 5, plan)
    head = _batches(first, 4)  # stopped in epoch 1, after its first batch
    resumed = TrainLoader(train, 4, 0, 1, 5, plan)
    resumed.load_state_dict(first.state_dict())
    got = head + _batches(resumed, 4)
    assert all(torch.equal(a, b) for a, b in zip(straight, got, strict=True))


def test_imagefolder_run_with_auto_loader_resumes_bit_exactly(tmp_path):
    """Persistent workers (auto), resumed mid-epoch, end with the weights of a straight run."""
    root = write_tree(tmp_path / "imagenet")
    args = [
        "train",
        "data=imagefolder",
        f"data.root={root}",
        "model.in_channels=3",
        "model.num_classes=3",
        "data.image_size=16",
        "data.val_resize=18",
        "train.batch_size=4",
        "train.max_steps=8",
        "train.eval_every=0",
        "train.log_every=2",
        "checkpoint.every=4",
        "checkpoint.keep=5",
        "loader.num_workers=2",  # a folder of 12 tiny images measures fastest in-process: ask for workers
        "jit=off",  # jit=auto decides from step times, which differ between two runs on a loaded machine
    ]
    runs = tmp_path / "runs"
    straight = run_fwk(*args, runs=runs)
    assert straight.returncode == 0, straight.stderr
    assert "loader=auto: " in straight.stdout and "persistent workers on" in straight.stdout, straight.stdout
    (run,) = runs.glob("*/")
    summary = json.loads((run / "summary.json").read_text())
    assert 0.0 <= summary["data_wait"] < 1.0
    expected = torch.load(run / "checkpoints/step-00000008/state.pt", weights_only=True)["model"]
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoints/step-00000008")  # as if it died after step 4 (epoch 1, batch 1)
    resumed = run_fwk(*args, runs=runs)
    assert resumed.returncode == 0, resumed.stderr
    assert "(step 4)" in resumed.stdout
    got = torch.load(run / "checkpoints/step-00000008/state.pt", weights_only=True)["model"]
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["loader=manual", "loader.num_workers=-1"], "loader.num_workers=-1 is not allowed: expected an integer >= 0"),
        (["loader.pin_memory=maybe"], "loader.pin_memory='maybe' is not allowed: expected one of auto, true, false"),
        (
            ["loader.prefetch_factor=-1"],
            "loader.prefetch_factor=-1 is not allowed: expected an integer >= 1 or 0 (auto)",
        ),
    ],
)
def test_bad_loader_values_are_one_line(overrides, expected):
    from fwk.config.compose import compose
    from fwk.config.validate import to_typed
    from fwk.errors import UserError

    with pytest.raises(UserError) as err:
        to_typed(compose(overrides))
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_loader_group_defaults_to_auto_and_the_recipe_sets_no_workers():
    from fwk.config.compose import compose
    from fwk.config.validate import to_typed

    cfg = to_typed(compose(["recipe=resnet50_imagenet", "loader.num_workers=4"]))
    assert cfg.loader == LoaderConfig(num_workers=4)  # auto, with the one value set
    assert to_typed(compose(["recipe=resnet50_imagenet"])).loader == AUTO


class _Ids(torch.utils.data.Dataset):
    """Items that are their own sample ids."""

    def __len__(self) -> int:
        return 27  # 27 // 8 = 3 steps an epoch of a global batch of 8, 3 samples left out

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.tensor(index), 0


def _steps(ranks: list[TrainLoader], accum: int, count: int) -> list[list[int]]:
    """The sample ids of ``count`` optimizer steps: every rank's ``accum`` batches, sorted."""
    its = [iter(r) for r in ranks]
    return [sorted(int(i) for it in its for _ in range(accum) for i in next(it)[0]) for _ in range(count)]


@pytest.mark.parametrize(
    "before,after",
    [((2, 4, 1), (1, 4, 2)), ((1, 8, 1), (2, 4, 1)), ((1, 4, 2), (4, 2, 1))],
    ids=["2-to-1-as-2-micro-batches", "1-to-2", "1-to-4-smaller-per-rank"],
)
def test_the_global_batch_sees_the_same_samples_at_every_step_on_any_world_size(
    before: tuple[int, int, int], after: tuple[int, int, int]
) -> None:
    """(processes, per-rank batch, accumulation) with one global batch of 8: the same sample
    ids at every step, and a position saved under one resumes under the other, mid-epoch
    and across epochs."""

    def loaders(world: int, batch: int, accum: int) -> list[TrainLoader]:
        return [TrainLoader(_Ids(), batch, r, world, 5, LoaderPlan(), accum_steps=accum) for r in range(world)]

    straight = _steps(loaders(*before), before[2], 8)  # 3 steps an epoch: through epoch 2
    assert sorted(sum(straight[:3], [])) != list(range(24)) and len(set(sum(straight[:3], []))) == 24
    assert straight[:3] != straight[3:6]  # each epoch its own permutation
    assert _steps(loaders(*after), after[2], 8) == straight
    first = loaders(*before)
    head = _steps(first, before[2], 4)  # stopped at step 4, one step into epoch 1
    resumed = loaders(*after)
    for r in resumed:
        r.load_state_dict(first[0].state_dict())
    assert head + _steps(resumed, after[2], 4) == straight
