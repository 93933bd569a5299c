"""loader=auto's plan: its choices as a pure function, set values winning, and the
start-up measurement leaving the run untouched."""

from __future__ import annotations

import pytest
import torch

from fwk.config.schema import LoaderConfig
from fwk.data.loader_plan import Host, LoaderPlan, decide, measure_rate, trial, worker_candidates
from tests.data.test_imagefolder import build, write_tree

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")

AUTO = LoaderConfig()


@pytest.mark.parametrize(
    "cores,processes,expected",
    [(2, 1, (1, 2)), (1, 1, (0, 1)), (16, 8, (1, 2)), (64, 8, (7, 8)), (96, 1, (15, 16)), (4, 8, (0, 1))],
)
def test_worker_candidates_leave_a_core_to_each_training_process(cores, processes, expected):
    assert worker_candidates(Host(cores, processes, cuda=False)) == expected


def test_in_memory_data_loads_in_the_training_process():
    chosen, why = decide(AUTO, Host(32, 1, cuda=True), in_memory=True, measure=lambda n: pytest.fail("measured"))
    assert chosen == LoaderPlan(num_workers=0, pin_memory=True, prefetch_factor=4, persistent_workers=False)
    assert why == (
        "loader=auto: 0 workers, pin_memory on (32 cores, 1 process, CUDA; "
        "in-memory data: workers would only add copies between processes)"
    )


def test_file_data_keeps_the_faster_measured_worker_count():
    rates = {0: 300.0, 1: 610.0, 2: 880.0}
    chosen, why = decide(AUTO, Host(2, 1, cuda=False), in_memory=False, measure=rates.__getitem__)
    assert chosen == LoaderPlan(num_workers=2, pin_memory=False, prefetch_factor=2, persistent_workers=True)
    assert why == (
        "loader=auto: 2 workers, prefetch 2, pin_memory off, persistent workers on (training's) "
        "(2 cores, 1 process, CPU; measured 880 items/s, vs 300 with 0 workers, 610 with 1 worker)"
    )
    rates = {0: 1000.0, 7: 5000.0, 8: 4000.0}  # the training process needed its core
    chosen, _ = decide(AUTO, Host(64, 8, cuda=True), in_memory=False, measure=rates.__getitem__)
    assert chosen == LoaderPlan(num_workers=7, pin_memory=True, prefetch_factor=2, persistent_workers=True)
    assert not chosen.val_persistent_workers  # evaluation's workers start per evaluation: no memory held between


def test_cheap_items_load_in_process_only_when_much_faster():
    host = Host(4, 1, cuda=False)
    chosen, _ = decide(AUTO, host, in_memory=False, measure={0: 2500.0, 3: 1000.0, 4: 1100.0}.__getitem__)
    assert chosen.num_workers == 0 and not chosen.persistent_workers  # generated items: IPC costs more
    chosen, _ = decide(AUTO, host, in_memory=False, measure={0: 2000.0, 3: 1000.0, 4: 1100.0}.__getitem__)
    assert chosen.num_workers == 4  # workers overlap the step: 1.8x is not enough
    chosen, _ = decide(AUTO, Host(1, 1, cuda=False), in_memory=False, measure={0: 900.0, 1: 1000.0}.__getitem__)
    assert chosen.num_workers == 1


def test_one_worker_queues_four_batches_and_no_measurement_leaves_a_core():
    chosen, why = decide(AUTO, Host(2, 1, cuda=False), in_memory=False, measure=None)
    assert chosen.num_workers == 1 and chosen.prefetch_factor == 4
    assert why.endswith("1 of 2 cores per rank, one left to the training process)")


def test_set_values_win_over_auto():
    cfg = LoaderConfig(num_workers=4, pin_memory="false", prefetch_factor=3, persistent_workers="False")
    chosen, why = decide(cfg, Host(2, 1, cuda=True), in_memory=True, measure=lambda n: pytest.fail("measured"))
    assert chosen == LoaderPlan(num_workers=4, pin_memory=False, prefetch_factor=3, persistent_workers=False)
    assert "num_workers as set" in why
    manual = LoaderConfig(name="manual", num_workers=0, pin_memory="true", prefetch_factor=2, persistent_workers="true")
    chosen, _ = decide(manual, Host(2, 1, cuda=False), in_memory=False)
    assert chosen == LoaderPlan(
        0, pin_memory=False, prefetch_factor=2, persistent_workers=False
    )  # nothing to pin to, no workers to keep


def test_measurement_leaves_the_run_untouched(tmp_path):
    bundle = build(write_tree(tmp_path / "t"), seed=3)
    train = bundle.train
    train.set_epoch(1)
    before = [train[i][0] for i in range(3)]
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    batch, make = trial(bundle, 4)
    assert batch == 4 and trial(bundle, 64)[0] == 16  # small batches: several fit the time of one count
    rate = measure_rate(make, workers=1, batch=batch, seconds=0.2)
    assert torch.equal(torch.rand(4), expected)  # no draw from the global generator
    assert rate > 0 and train.epoch == 1
    assert all(torch.equal(train[i][0], b) for i, b in enumerate(before))


def test_a_tiny_pass_is_read_again_and_an_empty_one_measures_nothing():
    passes = []

    def make(workers):
        class OneBatch:
            def __iter__(self):
                passes.append(workers)
                yield torch.zeros(2)

        return OneBatch()

    assert measure_rate(make, 0, 2, seconds=0.0) > 0 and passes == [0, 0]  # the second pass's batch is counted
    assert measure_rate(lambda workers: [], 0, 2, seconds=0.0) == 0.0
