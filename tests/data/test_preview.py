"""fwk.data.preview: the samples it shows are the ones training draws, in the same order."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import TensorDataset

from fwk.data.loader import TrainLoader
from fwk.data.loader_plan import LoaderPlan
from fwk.data.preview import first_samples, grid_shape, image_grid
from fwk.errors import UserError

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")


def _batches(dataset, batch_size, world_size, seed, count):
    loader = TrainLoader(dataset, batch_size, 0, world_size, seed, LoaderPlan())
    return list(itertools.islice(iter(loader), count))


@pytest.mark.parametrize("world_size", [1, 2])
def test_first_samples_are_the_train_loaders_across_epochs(world_size: int) -> None:
    # 23 items, batch 4: an epoch is 5 batches (20 items, 3 dropped) on one rank, 2 on each of 2.
    dataset = TensorDataset(torch.arange(23.0).view(23, 1), torch.arange(23))
    batches = _batches(dataset, 4, world_size, seed=7, count=7)
    n = 4 * 7  # crosses epoch boundaries: the second epoch is reshuffled
    samples = list(first_samples(dataset, n, 4, world_size, seed=7))
    assert [int(y) for _, _, y in samples] == torch.cat([y for _, y in batches]).tolist()
    assert [i for i, _, _ in samples] == [int(y) for _, _, y in samples]  # index is the item's own


def test_first_samples_of_an_augmented_folder_match_training(tmp_path) -> None:
    from tests.data.test_imagefolder import build, write_tree

    bundle = build(write_tree(tmp_path / "imagenet"), seed=3)
    (first, second) = _batches(bundle.train, 4, 1, seed=3, count=2)
    samples = list(first_samples(bundle.train, 8, 4, 1, seed=3))
    torch.testing.assert_close(torch.stack([x for _, x, _ in samples]), torch.cat([first[0], second[0]]))
    assert [y for _, _, y in samples] == torch.cat([first[1], second[1]]).tolist()


@pytest.mark.parametrize("n,expected", [(1, (1, 1)), (10, (4, 3)), (64, (8, 8)), (65, (9, 8))])
def test_grid_shape(n: int, expected: tuple[int, int]) -> None:
    assert grid_shape(n) == expected


def test_grid_upscales_small_images_and_undoes_normalization() -> None:
    # Five 8x8 one-channel images normalized with mean 0.5, std 0.25: upscaled 4x to 32 px,
    # 3 columns x 2 rows of (32 + 12 label) x 32 tiles with 2 px padding.
    images = [(torch.full((1, 8, 8), v) - 0.5) / 0.25 for v in (0.0, 0.25, 0.5, 0.75, 1.0)]
    picture, how = image_grid(images, list("01234"), (0.5,), (0.25,))
    assert picture.size == (3 * 34 + 2, 2 * 46 + 2)
    assert "mean/std" in how
    # Tile 1 (value 0.25) has grey 64 inside its image area, whatever the label strip shows.
    assert picture.getpixel((34 + 2 + 16, 2 + 16)) == (64, 64, 64)


def test_grid_refuses_what_is_not_an_image() -> None:
    with pytest.raises(UserError, match=r"shape \(5,\)"):
        image_grid([torch.zeros(5)], ["0"], None, None)
