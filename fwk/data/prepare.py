"""``fwk data prepare``, which writes an image folder once as litdata shards that stream.

FFCV's lesson is that most of a fast image pipeline is the prepare step. Each image is read
once, and its shorter side is brought down to ``max_side``. The aspect is kept, an image is
never enlarged, and JPEGs are decoded at a reduced scale where libjpeg can (``Image.draft``).
The image is then re-encoded as JPEG at ``quality``, or stored uncompressed as a binary PPM
where the result's longer side is at most ``raw_max_side``. A small image, such as CIFAR's
32 px, costs more to decode than to copy, and a JPEG of it loses detail that matters at its
size. litdata's ``optimize`` writes them with their labels into chunks, in parallel workers,
with a progress bar. Training then decodes ~320 px JPEGs instead of full-size ones, and reads
a few large files instead of a million small ones, locally or from object storage
(``data=streaming``).

The output is finished when ``fwk-manifest.json`` is written, last. A marker written first,
``.fwk-preparing``, tells an interrupted prepare, which is restarted from scratch, from a
folder that holds something else, which is refused. A finished one with the same source and
settings is reported and left alone. One of another source or settings is refused.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import multiprocessing
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fwk import __version__
from fwk.data import shards
from fwk.data.configs import ImageFolderConfig
from fwk.errors import UserError
from fwk.track.store import write_atomic

logger = logging.getLogger(__name__)

MARKER = shards.MARKER
SPLITS = ("train", "val")
# The training items are written in one fixed shuffled order (litdata keeps the input order
# with keep_data_ordered, whatever the workers' timing). litdata shuffles chunks, and
# items only within the chunks a worker holds at a time: a set written in the folder's
# order (sorted by class) would feed each epoch a few classes at a time, and a model trained
# so stays near chance (resnet_digits: 8-11% val acc against 61-94% from the folder).
SHUFFLE_SEED = 0


def encode(item: tuple[str, int, int], max_side: int, quality: int, raw_max_side: int) -> dict[str, Any]:
    """Encode one image file as a record with "image", "label" and "index".

    "image" holds JPEG or raw PPM bytes, with the shorter side at most ``max_side``."""
    from PIL import Image

    path, label, index = item
    with Image.open(path) as image:
        w, h = image.size
        scale = min(1.0, max_side / min(w, h))
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        if image.format == "JPEG" and scale < 1.0:
            image.draft("RGB", size)  # libjpeg decodes at 1/2, 1/4 or 1/8 scale, still >= size
        rgb = image.convert("RGB")
        if rgb.size != size:
            rgb = rgb.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
        out = io.BytesIO()
        if max(rgb.size) <= raw_max_side:
            rgb.save(out, "PPM")  # P6: a header line, then the RGB bytes
        else:
            rgb.save(out, "JPEG", quality=quality)
    return {"image": out.getvalue(), "label": int(label), "index": int(index)}


def _check_out(out: Path, wanted: dict[str, Any]) -> bool:
    """Return True when ``out`` already holds this prepare, finished, and clear an interrupted one."""
    manifest = out / shards.MANIFEST
    if manifest.is_file():
        return shards.same_set(json.loads(manifest.read_text()), wanted, str(out))
    if (out / MARKER).is_file():
        logger.info(f"{out}: an interrupted prepare; starting it again")
        for split in SPLITS:
            shutil.rmtree(out / split, ignore_errors=True)
        return False
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} is not empty and holds no fwk prepare; choose an empty or new folder")
    return False


# Forked workers start in milliseconds; litdata's default (spawn) re-imports fwk and torch in
# each, seconds per split. The encoder needs no CUDA state or lock of the parent's; litdata's
# own feeder threads run beside the fork (Python 3.12 warns of that; none is held by it).
_FORK = "fork" if "fork" in multiprocessing.get_all_start_methods() else None


@contextlib.contextmanager
def _start_method_kept() -> Iterator[None]:
    """Give the process its multiprocessing start method back after litdata.optimize.

    litdata.optimize sets it to spawn, for good. This process's later loaders, with forked
    workers, get the one it had back."""
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        yield
    finally:
        multiprocessing.set_start_method(before, force=True)


def prepare(
    cfg: ImageFolderConfig,
    out: str,
    max_side: int,
    quality: int,
    workers: int,
    raw_max_side: int = 64,
    chunk_mb: int = 64,
    endpoint_url: str = "",
) -> str:
    """Write the image folder of ``cfg`` to ``out`` as shards, and return the line to say last.

    ``out`` is a folder, or s3://bucket/prefix. An s3:// prefix is staged locally, then
    uploaded, by ``publish.py``."""
    from fwk.data.fingerprint import of_image_folder
    from fwk.data.imagefolder import find_images

    if not 16 <= max_side <= 4096 or not 1 <= quality <= 100 or not 0 <= raw_max_side <= 1024:
        raise UserError(
            f"--max-side {max_side} --quality {quality} --raw-max-side {raw_max_side}: expected 16-4096 px, "
            "a JPEG quality of 1-100 and 0-1024 px"
        )
    if not 1 <= chunk_mb <= 4096:
        raise UserError(f"--chunk-mb {chunk_mb}: expected 1-4096 (MB per chunk file)")
    root = os.path.expanduser(cfg.root)
    found = find_images(cfg.root)
    source = of_image_folder(Path(root))
    wanted = {
        "format": shards.FORMAT,
        "source": {"digest": source.digest, "what": source.what},
        "settings": {"max_side": max_side, "quality": quality, "raw_max_side": raw_max_side, "chunk_mb": chunk_mb},
    }
    fn = functools.partial(encode, max_side=max_side, quality=quality, raw_max_side=raw_max_side)

    def write(target: Path) -> str:
        return _write(target, root, found, wanted, fn, chunk_mb, workers)

    if shards.is_remote(out):
        from fwk.data.publish import publish

        return publish(out, endpoint_url, wanted, write)
    target = Path(os.path.expanduser(out)).resolve()
    if _check_out(target, wanted):
        manifest = json.loads((target / shards.MANIFEST).read_text())
        return f"already prepared: {target} ({shards.describe(manifest)})"
    return write(target)


def _write(
    target: Path,
    root: str,
    found: tuple[list[str], tuple[list[str], list[int]], tuple[list[str], list[int]]],
    wanted: dict[str, Any],
    fn: Callable[[tuple[str, int, int]], dict[str, Any]],
    chunk_mb: int,
    workers: int,
) -> str:
    """Write the shards and, last, the manifest in ``target``, and return the line that says so."""
    import litdata

    from fwk.data.imagefolder import IMAGENET_MEAN, IMAGENET_STD

    classes, train, val = found
    target.mkdir(parents=True, exist_ok=True)
    write_atomic(target / MARKER, json.dumps(wanted) + "\n")
    t0 = time.perf_counter()
    counts = {}
    for split, (paths, labels) in zip(SPLITS, (train, val), strict=True):
        items = [
            (os.path.join(root, split, p), label, i) for i, (p, label) in enumerate(zip(paths, labels, strict=True))
        ]
        if split == "train":  # see SHUFFLE_SEED
            random.Random(SHUFFLE_SEED).shuffle(items)
        logger.info(f"{split}: {len(items):,} images -> {target / split} ({workers} workers)")
        with _start_method_kept():
            litdata.optimize(
                fn=fn,
                inputs=items,
                output_dir=str(target / split),
                chunk_bytes=f"{chunk_mb}MB",
                num_workers=workers,
                mode="overwrite",
                start_method=_FORK,
                keep_data_ordered=True,
            )
        counts[split] = len(items)
    seconds = time.perf_counter() - t0
    manifest = {
        **wanted,
        "fwk": __version__,
        "counts": counts,
        "classes": classes,
        "mean": list(IMAGENET_MEAN),
        "std": list(IMAGENET_STD),
    }
    write_atomic(target / shards.MANIFEST, json.dumps(manifest, indent=2) + "\n")  # last: now it is finished
    (target / MARKER).unlink()
    total = sum(counts.values())
    return f"prepared {target}: {shards.describe(manifest)}; {total / seconds:,.0f} images/s ({seconds:.1f} s)"
