"""The image pipeline's benchmark on ImageNet-like photos: torchvision's ImageFolder against
fwk's image folder and fwk's streamed shards (local and from S3), as images/s ratios.

    .venv/bin/python -m benchmarks.decode [--images 2000] [--rounds 3] [--workers 2] [--batch 32]

The photos (``write_photos``): 10 class folders, each cut from one real photograph that
scikit-learn or scikit-image ships (random crops of 30-100% of its area, 3/4 of them
landscape), resized to 500x375 or 375x500 px, with sensor-like noise (sigma 6) and JPEG
quality 92-97: ~95 KB a file, as ImageNet's are (~110 KB, ~400x350 px on average).

Rows, all at 224 px with the same augmentation (RandomResizedCrop, flip, float, normalize),
batch and workers; each pass delivers one epoch of batches to this, the training, process:

1. ``torchvision``: ``torchvision.datasets.ImageFolder`` (PIL) with v2 transforms, as
   torchvision's reference classification script loads ImageNet (the reference);
2. ``fwk folder``: fwk's imagefolder data through fwk's training loader;
3. ``fwk shards N``: ``fwk data prepare --max-side N --chunk-mb 4`` (N: 256, 320), read
   by ``data=streaming`` from the local folder. 4 MB chunks: 2,000 photos make ~10-20 of
   them, so each worker streams many, as from the thousands of 64 MB chunks of an
   ImageNet-size set (with one or two chunks, the worker given the bigger one ends alone);
4. ``fwk S3 N``: the same shards uploaded to moto's S3-compatible server on loopback, its
   cache emptied before every pass, so every chunk comes over HTTP;
5. on a CUDA machine, ``fwk folder decode=gpu``: the folder's bytes decoded by nvJPEG and
   augmented on the GPU (``data.decode=gpu``), each batch synchronized.

Each round runs one pass of every row in turn (interleaved, so drift hits all alike).
images/s are counted from each pass's first batch on (the workers' start and the first
chunk's download are paid once per epoch, not per image; ``first_s`` reports them).
``run()`` also reports ``fwk data prepare``'s own images/s per --max-side.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from fwk.data.configs import ImageFolderConfig, StreamingConfig
from fwk.data.imagefolder import IMAGENET_MEAN, IMAGENET_STD, imagefolder
from fwk.data.loader import TrainLoader
from fwk.data.loader_plan import LoaderPlan, loader_kwargs

SIZE = 224
PHOTO = (500, 375)


def photographs() -> dict[str, Any]:
    """Ten real photographs (H, W, 3) uint8 by name: scikit-learn's two, scikit-image's eight."""
    import numpy as np
    import skimage.data
    from sklearn.datasets import load_sample_images

    china, flower = load_sample_images().images
    out = {"china": china, "flower": flower}
    for name in ("astronaut", "chelsea", "coffee", "hubble_deep_field", "immunohistochemistry", "retina", "rocket",
                 "camera"):  # fmt: skip
        image = getattr(skimage.data, name)()
        out[name] = np.stack([image] * 3, -1) if image.ndim == 2 else image  # camera is grayscale
    return out


def write_photos(
    root: Path, images: int, val_per_class: int = 10, seed: int = 0, size: tuple[int, int] = PHOTO
) -> float:
    """``images`` training photos (and ``val_per_class`` per class) of ``size`` (w, h) px
    under root/{train,val}/<class>/; returns their mean size in KB."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    sources = photographs()
    sizes = []
    for split, per_class in (("train", images // len(sources)), ("val", val_per_class)):
        for name, photo in sources.items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            h, w, _ = photo.shape
            for k in range(per_class):
                out = size if rng.random() < 0.75 else size[::-1]
                aspect = out[0] / out[1]
                area = rng.uniform(0.3, 1.0) * h * w
                cw = min(w, int((area * aspect) ** 0.5), int(h * aspect))
                ch = int(cw / aspect)
                y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
                crop = Image.fromarray(photo[y : y + ch, x : x + cw]).resize(out, Image.Resampling.BICUBIC)
                noisy = np.asarray(crop, dtype=np.float32) + rng.normal(0, 6.0, (out[1], out[0], 3))
                path = folder / f"{name}_{k:05d}.JPEG"
                quality = int(rng.integers(92, 98))
                Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(path, "JPEG", quality=quality)
                sizes.append(path.stat().st_size)
    return statistics.fmean(sizes) / 1e3


def _torchvision(root: Path, batch: int, workers: int) -> Callable[[int], Iterable[Any]]:
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    transform = v2.Compose(
        [
            v2.RandomResizedCrop(SIZE, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    data = ImageFolder(str(root / "train"), transform=transform)
    # PyTorch's defaults otherwise, as the reference script
    return lambda epoch: DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers)


def _plan(workers: int) -> LoaderPlan:
    return LoaderPlan(num_workers=workers, prefetch_factor=2, persistent_workers=False)


def _folder(root: Path, batch: int, workers: int, gpu: bool = False) -> Callable[[int], Iterable[Any]]:
    """fwk's image folder through its training loader; ``gpu``: ``data.decode=gpu`` (the
    workers read bytes, nvJPEG decodes and the crops run on the GPU, each batch synchronized)."""
    bundle = imagefolder(ImageFolderConfig(root=str(root), image_size=SIZE, decode="gpu" if gpu else "cpu"), seed=0)
    loader = TrainLoader(bundle.train, batch, 0, 1, 0, _plan(workers), bundle.collate)
    device = torch.device("cuda" if gpu else "cpu")

    def epoch(e: int) -> Iterator[Any]:
        loader.load_state_dict({"epoch": e, "batch_in_epoch": 0})
        batches = iter(loader)
        try:
            for _ in range(loader.batches_per_epoch):
                batch = next(batches)
                if bundle.finish is not None:
                    batch = bundle.finish(batch, device)
                    torch.cuda.synchronize(device)  # delivered: decoded and augmented on the device
                yield batch
        finally:
            batches.close()  # its workers stop and are reaped here

    return epoch


def _streamed(cfg: StreamingConfig, batch: int, workers: int, cache: Path | None) -> Callable[[int], Iterable[Any]]:
    from fwk.data.streaming import streaming

    def epoch(e: int) -> Iterable[Any]:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)  # every chunk comes over HTTP again
        bundle = streaming(cfg, seed=e)
        assert bundle.train_loader is not None
        return bundle.train_loader(batch, 1, loader_kwargs(_plan(workers)), None, 0).loader

    return epoch


def one_pass(batches: Iterable[Any]) -> tuple[float, float]:
    """(images/s from the first batch on, seconds to the first batch)."""
    start = time.perf_counter()
    first, images = None, 0
    for x, _ in batches:
        if first is None:
            first = time.perf_counter()
        else:
            images += len(x)
    if not images:
        raise ValueError("a pass delivered fewer than 2 batches: give the benchmark more images")
    return images / (time.perf_counter() - first), first - start


def _prepare(root: Path, out: Path, side: int, workers: int, chunk_mb: int) -> float:
    from fwk.data.prepare import prepare

    count = sum(1 for f in root.rglob("*.JPEG"))
    t0 = time.perf_counter()
    prepare(ImageFolderConfig(root=str(root)), str(out), side, 90, workers, chunk_mb=chunk_mb)
    return count / (time.perf_counter() - t0)


def run(
    images: int = 2000,
    batch: int = 32,
    workers: int = 2,
    rounds: int = 3,
    sides: tuple[int, ...] = (256, 320),
    s3: bool = True,
    chunk_mb: int = 4,
) -> dict[str, Any]:
    """{"kb": mean photo KB, "prepare": {side: images/s}, "rows": [{name, images_per_s, min, max,
    ratio (to torchvision, of the medians), round_ratios, first_s}]}."""
    from tests.s3server import loopback_s3, server_path, upload

    with tempfile.TemporaryDirectory(prefix="fwk-bench-decode-") as tmp, _env(Path(tmp)):
        base = Path(tmp)
        kb = write_photos(base / "photos", images)
        rates = {side: _prepare(base / "photos", base / f"shards-{side}", side, workers, chunk_mb) for side in sides}
        make = {
            "torchvision": _torchvision(base / "photos", batch, workers),
            "fwk folder": _folder(base / "photos", batch, workers),
        }
        if torch.cuda.is_available():
            make["fwk folder decode=gpu"] = _folder(base / "photos", batch, workers, gpu=True)
        for side in sides:
            make[f"fwk shards {side}"] = _streamed(StreamingConfig(uri=str(base / f"shards-{side}"), image_size=SIZE),
                                                   batch, workers, None)  # fmt: skip
        with loopback_s3() if s3 and server_path().is_file() else contextlib.nullcontext() as endpoint:
            for side in sides if endpoint else ():
                uri = upload(endpoint, base / f"shards-{side}", "bench", f"shards-{side}")
                cache = base / f"cache-{side}"
                cfg = StreamingConfig(uri=uri, image_size=SIZE, endpoint_url=endpoint, cache_dir=str(cache))
                make[f"fwk S3 {side}"] = _streamed(cfg, batch, workers, cache)
            for loader in make.values():  # warm-up: page cache, imports, lazy inits
                one_pass(loader(0))
            seen: dict[str, list[tuple[float, float]]] = {name: [] for name in make}
            for r in range(rounds):
                for name, loader in make.items():
                    seen[name].append(one_pass(loader(r + 1)))
    reference = [rate for rate, _ in seen["torchvision"]]
    rows = []
    for name, passes in seen.items():
        got = [rate for rate, _ in passes]
        rows.append(
            {
                "name": name,
                "images_per_s": statistics.median(got),
                "min": min(got),
                "max": max(got),
                "ratio": statistics.median(got) / statistics.median(reference),
                "round_ratios": [a / b for a, b in zip(got, reference, strict=True)],
                "first_s": statistics.median(first for _, first in passes),
            }
        )
    return {"kb": kb, "prepare": rates, "rows": rows, "images": images, "workers": workers, "batch": batch}


def _env(tmp: Path) -> Any:
    """The loopback server's credentials and none of the user's AWS files, inside."""
    import os
    from unittest import mock

    from tests.s3server import CREDENTIALS

    none = str(tmp / "none")
    values = {"AWS_SHARED_CREDENTIALS_FILE": none, "AWS_CONFIG_FILE": none, "AWS_EC2_METADATA_DISABLED": "true"}
    return mock.patch.dict(os.environ, {**CREDENTIALS, **values, "XDG_CACHE_HOME": str(tmp / "xdg")})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=2000, help="training photos (10 classes)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved passes per row (median)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes (all rows)")
    parser.add_argument("--no-s3", action="store_true", help="skip the rows read from the loopback S3 server")
    args = parser.parse_args()
    got = run(args.images, args.batch, args.workers, args.rounds, s3=not args.no_s3)
    print(f"{args.images} photos of 500x375 px, {got['kb']:.0f} KB on average; 224 px, batch {args.batch}, "
          f"{args.workers} workers, {args.rounds} interleaved rounds")  # fmt: skip
    for side, rate in got["prepare"].items():
        print(f"fwk data prepare --max-side {side}: {rate:.0f} images/s")
    print(f"{'pipeline':<18} {'images/s':>9} {'[min, max]':>14} {'vs torchvision':>15} {'first batch':>12}")
    for r in got["rows"]:
        span = f"[{r['min']:.0f}, {r['max']:.0f}]"
        print(f"{r['name']:<18} {r['images_per_s']:>9.0f} {span:>14} "
              f"{r['ratio']:>14.2f}x {r['first_s']:>11.2f}s")  # fmt: skip


if __name__ == "__main__":
    main()
