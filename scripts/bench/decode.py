"""fwk's image loader alone (no model) against torchvision's PIL-based ImageFolder, as ratios.

    .venv/bin/python scripts/bench/decode.py [--rounds 5] [--images 256] [--workers 2] [--batch 32]

On folders of real JPEGs it writes (crops of scikit-learn's two sample photos, re-encoded
at quality 90) at 64 and 224 px, three loaders read the same files with the same
augmentation (RandomResizedCrop to the folder's size, flip, float, normalize), the same
batch and workers:

- ``fwk``: fwk's imagefolder data set (read(2) + decode_jpeg, per-item CPU seeding, crop
  and flip in one step: fwk/data/augment.py) with the DataLoader settings fwk uses;
- ``fwk before``: the same data set as fwk read it before issue 11: ``read_file`` (a
  memory map per file) and a per-item ``torch.manual_seed``;
- ``torchvision``: ``torchvision.datasets.ImageFolder`` (PIL decode) and v2 transforms on
  PIL images, as torchvision's reference classification script loads ImageNet.

Each round reads the whole folder once with each loader, in turn (interleaved, so drift
hits all alike); images/s are counted from each pass's first batch on (the workers' start
is paid once per run, not per image). Rows: median of the rounds, min and max, and the
workers' user and system CPU time per image. ``run()`` returns them for other scripts.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from fwk.data.configs import ImageFolderConfig
from fwk.data.imagefolder import IMAGENET_MEAN, IMAGENET_STD, imagefolder
from fwk.data.images import decode_bytes
from fwk.data.loader import LoaderPlan, loader_kwargs


def write_folder(root: Path, size: int, images: int) -> Path:
    """``images`` JPEGs of about ``size`` x 4/3 ``size`` px in root/{train,val}/<photo>/."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    photos = load_sample_images()
    for split, count in (("train", images), ("val", 2)):
        for name, photo in zip(("china", "flower"), photos.images, strict=True):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            h, w, _ = photo.shape
            for k in range(count // 2):
                ch, cw = int(h * rng.uniform(0.5, 1.0)), int(w * rng.uniform(0.5, 1.0))
                y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
                crop = Image.fromarray(photo[y : y + ch, x : x + cw])
                short = round(size * rng.uniform(1.0, 1.3))  # a little larger than the crop, as ImageNet is
                crop = crop.resize((round(short * cw / ch), short), Image.BILINEAR)
                crop.save(folder / f"{name}_{k}.JPEG", "JPEG", quality=90)
    return root


class _Before(Dataset):
    """fwk's data set as it seeded each item before issue 11: ``torch.manual_seed`` in a fork."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from torchvision.io import read_file

        from fwk.data.base import item_seed

        d = self.dataset
        image = decode_bytes(read_file(d.path(index)))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(item_seed(d.seed, d.epoch, index))
            image = d.transform(image)
        return image, int(d.labels[index])


def _torchvision(root: Path, size: int) -> Dataset:
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    transform = v2.Compose(
        [
            v2.RandomResizedCrop(size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    return ImageFolder(str(root / "train"), transform=transform)


def loaders(root: Path, size: int, batch: int, workers: int) -> dict[str, Callable[[int], DataLoader]]:
    """name -> a function of the epoch giving that loader for one pass."""
    train = imagefolder(ImageFolderConfig(root=str(root), image_size=size), seed=0).train
    reference = _torchvision(root, size)
    fwk_kwargs = loader_kwargs(LoaderPlan(num_workers=workers, prefetch_factor=2))
    plain = {"num_workers": workers}  # PyTorch's defaults otherwise, as the reference script

    def fwk(epoch: int) -> DataLoader:
        train.set_epoch(epoch)
        return DataLoader(train, batch_size=batch, shuffle=True, drop_last=True, **fwk_kwargs)

    def before(epoch: int) -> DataLoader:
        train.set_epoch(epoch)
        return DataLoader(_Before(train), batch_size=batch, shuffle=True, drop_last=True, **plain)

    def tv(epoch: int) -> DataLoader:
        return DataLoader(reference, batch_size=batch, shuffle=True, drop_last=True, **plain)

    return {"fwk": fwk, "fwk before": before, "torchvision": tv}


@contextlib.contextmanager
def _children_cpu() -> Iterator[list[float]]:
    """[user s, system s] of the child processes (loader workers) reaped inside."""
    out: list[float] = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    yield out
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out += [after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime]


def one_pass(loader: DataLoader) -> tuple[float, float, float]:
    """(images/s from the first batch on, worker user s / image, worker system s / image)."""
    with _children_cpu() as cpu:
        first, images = None, 0
        iterator = iter(loader)
        for x, _ in iterator:
            if first is None:
                first = time.perf_counter()
            else:
                images += len(x)
        elapsed = time.perf_counter() - (first or 0.0)
        del iterator  # non-persistent workers are reaped here, so their CPU time is counted
    total = images + loader.batch_size
    return images / elapsed, cpu[0] / total, cpu[1] / total


def run(
    sizes: tuple[int, ...] = (64, 224), images: int = 256, batch: int = 32, workers: int = 2, rounds: int = 5
) -> list[dict[str, Any]]:
    """One row per (size, loader): images/s median/min/max, ratio to torchvision, CPU per image."""
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fwk-bench-decode-") as tmp:
        for size in sizes:
            root = write_folder(Path(tmp) / f"{size}px", size, images)
            make = loaders(root, size, batch, workers)
            for loader in make.values():  # warm-up: page cache, imports, lazy inits
                one_pass(loader(0))
            seen: dict[str, list[tuple[float, float, float]]] = {name: [] for name in make}
            for r in range(rounds):
                for name, loader in make.items():
                    seen[name].append(one_pass(loader(r + 1)))
            reference_rates = [rate for rate, _, _ in seen["torchvision"]]
            reference = statistics.median(reference_rates)
            for name, passes in seen.items():
                rates = [rate for rate, _, _ in passes]
                rows.append(
                    {
                        "name": f"loader {size}px {name}",
                        "size": size,
                        "loader": name,
                        "images_per_s": statistics.median(rates),
                        "min": min(rates),
                        "max": max(rates),
                        "ratio": statistics.median(rates) / reference,
                        "round_ratios": [a / b for a, b in zip(rates, reference_rates, strict=True)],
                        "user_ms_per_image": 1000 * statistics.median(u for _, u, _ in passes),
                        "sys_ms_per_image": 1000 * statistics.median(s for _, _, s in passes),
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="interleaved passes per loader (median)")
    parser.add_argument("--images", type=int, default=256, help="training images per folder")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes (all loaders)")
    parser.add_argument("--sizes", default="64,224", help="image sides in px, comma-separated")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    rows = run(sizes, args.images, args.batch, args.workers, args.rounds)
    print(
        f"loader alone, {args.images} JPEGs, batch {args.batch}, {args.workers} workers, "
        f"median of {args.rounds} interleaved passes [min, max]; CPU: the workers', per image"
    )
    print(f"{'loader':<24} {'images/s':>9} {'[min, max]':>15} {'vs torchvision':>15} {'user ms':>8} {'sys ms':>7}")
    for row in rows:
        span = f"[{row['min']:.0f}, {row['max']:.0f}]"
        print(
            f"{row['name']:<24} {row['images_per_s']:9.0f} {span:>15} {row['ratio']:14.2f}x "
            f"{row['user_ms_per_image']:8.2f} {row['sys_ms_per_image']:7.2f}"
        )


if __name__ == "__main__":
    main()
