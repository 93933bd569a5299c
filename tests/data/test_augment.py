"""CropFlip: torchvision's RandomResizedCrop + RandomHorizontalFlip in one step, checked
against torchvision's own kernels and sampling."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from torchvision.io import decode_jpeg, encode_jpeg
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from fwk.data.augment import CropFlip, crop_box
from fwk.data.images import seeded_cpu_rng

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")
RATIO = (3 / 4, 4 / 3)


def photo(h: int = 90, w: int = 120) -> torch.Tensor:
    """A decoded JPEG: (3, H, W) uint8 in decode_jpeg's channels-last layout."""
    y, x = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    image = (torch.stack([x, y, (x * y) ** 0.5]) * 255).to(torch.uint8)
    return decode_jpeg(encode_jpeg(image, quality=90))


def test_crop_box_stays_inside_and_within_scale_and_ratio() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(500):
        h, w = (int(v) for v in torch.randint(20, 300, (2,), generator=gen))
        u = torch.rand(23, generator=gen).tolist()
        top, left, ch, cw = crop_box(h, w, u, (0.08, 1.0), RATIO)
        assert 0 <= top and top + ch <= h and 0 <= left and left + cw <= w
        if (ch, cw) != (h, w) and top == (h - ch) // 2 and left == (w - cw) // 2:
            continue  # the central fallback: checked below
        assert 0.08 * h * w * 0.8 <= ch * cw <= h * w
        assert 3 / 4 * 0.8 <= cw / ch <= 4 / 3 * 1.25  # rounding to whole pixels on small crops


def test_crop_box_falls_back_to_the_central_crop_as_torchvision_does() -> None:
    # A whole-image crop at ratio 4..5 never fits a square image: torchvision's fallback
    # cuts the image to the nearest allowed ratio, centred.
    u = [0.5] * 23
    assert crop_box(100, 100, u, (1.0, 1.0), (4.0, 5.0)) == (37, 0, 25, 100)
    torch.manual_seed(0)
    params = v2.RandomResizedCrop(8, scale=(1.0, 1.0), ratio=(4.0, 5.0)).make_params([torch.zeros(3, 100, 100)])
    assert (params["top"], params["left"], params["height"], params["width"]) == (37, 0, 25, 100)


def test_crop_statistics_match_random_resized_crop() -> None:
    """Over 3000 crops of a 90 x 120 image, area fraction and log aspect ratio have the same
    mean and spread as torchvision's sampler (different draws, same distribution)."""
    torch.manual_seed(0)
    image = torch.zeros(3, 90, 120)
    ours, theirs = [], []
    reference = v2.RandomResizedCrop(8, scale=(0.08, 1.0), ratio=RATIO)
    for _ in range(3000):
        _, _, h, w = crop_box(90, 120, torch.rand(23).tolist(), (0.08, 1.0), RATIO)
        ours.append((h * w / (90 * 120), math.log(w / h)))
        p = reference.make_params([image])
        theirs.append((p["height"] * p["width"] / (90 * 120), math.log(p["width"] / p["height"])))
    for k in range(2):
        a, b = [x[k] for x in ours], [x[k] for x in theirs]
        assert abs(statistics.mean(a) - statistics.mean(b)) < 0.02
        assert abs(statistics.stdev(a) - statistics.stdev(b)) < 0.02


def test_crop_flip_is_a_function_of_the_seed() -> None:
    image, t = photo(), CropFlip(48)
    with seeded_cpu_rng(7):
        a = t(image)
    with seeded_cpu_rng(7):
        b = t(image)
    with seeded_cpu_rng(8):
        c = t(image)
    assert a.shape == (3, 48, 48) and a.dtype == torch.uint8
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_crop_equals_torchvision_on_its_box_and_flips_half() -> None:
    image = photo()
    flips = 0
    for seed in range(400):
        with seeded_cpu_rng(seed):
            u = torch.rand(23).tolist()
        top, left, h, w = crop_box(90, 120, u, (0.08, 1.0), RATIO)
        plain = TF.resized_crop_image(image, top, left, h, w, [32, 32], antialias=True)  # torchvision's crop
        with seeded_cpu_rng(seed):
            out = CropFlip(32)(image)
        with seeded_cpu_rng(seed):
            kept = CropFlip(32, p_flip=0.0)(image)
        assert torch.equal(kept, plain)
        flipped = torch.equal(out, plain.flip(-1)) and not torch.equal(out, plain)
        assert flipped == (u[-1] < 0.5)
        flips += flipped
    assert 160 <= flips <= 240  # 400 fair coins: mean 200, sd 10


def test_rejects_bad_scale_or_ratio() -> None:
    with pytest.raises(ValueError, match="increasing pairs"):
        CropFlip(32, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="increasing pairs"):
        CropFlip(32, ratio=(0.0, 1.0))
