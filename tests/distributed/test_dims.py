"""The layout's arithmetic: degrees resolved to the world size, each rank's place, the batch
dimension the loaders split by."""

from __future__ import annotations

import pytest

from fwk.distributed.dims import Dims, resolve


def test_minus_one_takes_what_is_left_and_zero_shards_over_a_machine() -> None:
    assert resolve({"tp": 2, "dp_shard": -1}, 8, 8) == (Dims(tp=2, dp_shard=4), "")
    assert resolve({"pp": -1}, 4, 4) == (Dims(pp=4), "")
    assert resolve({"dp_replicate": -1, "dp_shard": 0}, 8, 4) == (Dims(dp_replicate=2, dp_shard=4), "")
    assert resolve({"dp_replicate": -1, "dp_shard": 0}, 8, 4, shard_size=2) == (Dims(dp_replicate=4, dp_shard=2), "")


@pytest.mark.parametrize(
    ("degrees", "world", "problem"),
    [
        ({"tp": 3}, 4, "parallel degrees tp=3 multiply to 3, but 4 processes train"),
        ({"tp": 3, "pp": -1}, 4, "parallel degrees pp=-1 x tp=3 multiply to 3, but 4 processes train"),
        ({"tp": -1, "pp": -1}, 4, "parallel.pp and parallel.tp are both -1"),
        ({"tp": -2}, 4, "parallel.tp=-2: a degree is an integer >= 1, or -1"),
    ],
)
def test_degrees_that_do_not_fit_say_what_would(degrees: dict, world: int, problem: str) -> None:
    dims, said = resolve(degrees, world, world)
    assert dims is None and said.startswith(problem) and "\n" not in said


def test_ranks_are_row_major_with_tp_innermost_and_peers_share_a_batch() -> None:
    dims = Dims(pp=2, dp_replicate=1, dp_shard=2, tp=2)  # 8 ranks
    assert [dims.coords(r) for r in (0, 1, 2, 7)] == [
        {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "tp": 0},
        {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "tp": 1},
        {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "tp": 0},
        {"pp": 1, "dp_replicate": 0, "dp_shard": 1, "tp": 1},
    ]
    assert dims.batch_degree == 2
    assert [dims.batch_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]  # tp peers and stages: one batch
    assert [r for r in range(8) if dims.reports(r)] == [4, 6]  # one per batch: tp rank 0 of the last stage
    assert dims.label() == "pp=2 x dp_shard=2 x tp=2" and Dims().label() == "one process"
