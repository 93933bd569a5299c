"""``fwk data prepare``: an image folder written once as litdata shards that stream.

FFCV's lesson: most of a fast image pipeline is the prepare step. Each image is read once,
its shorter side brought down to ``max_side`` (aspect kept; never enlarged; JPEGs decoded
at a reduced scale where libjpeg can, ``Image.draft``) and re-encoded as JPEG at
``quality``; litdata's ``optimize`` writes them with their labels into chunks, in parallel
workers, with a progress bar. Training then decodes ~320 px JPEGs instead of full-size
ones, and reads a few large files instead of a million small ones, locally or from object
storage (``data=streaming``).

The output is finished when ``fwk-manifest.json`` is written, last. A marker written first
(``.fwk-preparing``) tells an interrupted prepare (restarted from scratch) from a folder
that holds something else (refused). A finished one with the same source and settings is
reported and left alone; one of another source or settings is refused.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fwk import __version__
from fwk.data import shards
from fwk.data.configs import ImageFolderConfig
from fwk.errors import UserError
from fwk.track.store import write_atomic

MARKER = ".fwk-preparing"
SPLITS = ("train", "val")


def encode(item: tuple[str, int, int], max_side: int, quality: int) -> dict[str, Any]:
    """One image file -> {"image": JPEG bytes, shorter side <= max_side; "label"; "index"}."""
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
        rgb.save(out, "JPEG", quality=quality)
    return {"image": out.getvalue(), "label": int(label), "index": int(index)}


def _check_out(out: Path, wanted: dict[str, Any], say: Callable[[str], None]) -> bool:
    """True when ``out`` already holds this prepare, finished; clears an interrupted one."""
    manifest = out / shards.MANIFEST
    if manifest.is_file():
        found = json.loads(manifest.read_text())
        same = {k: found.get(k) for k in wanted} == wanted
        if same:
            return True
        raise UserError(
            f"--out {out} holds another prepared set ({shards.describe(found)}); choose another --out, or delete it "
            "to prepare this one there"
        )
    if (out / MARKER).is_file():
        say(f"{out}: an interrupted prepare; starting it again")
        for split in SPLITS:
            shutil.rmtree(out / split, ignore_errors=True)
        return False
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} is not empty and holds no fwk prepare; choose an empty or new folder")
    return False


def prepare(
    cfg: ImageFolderConfig, out: str, max_side: int, quality: int, workers: int, say: Callable[[str], None]
) -> str:
    """Write the image folder of ``cfg`` to ``out`` as shards; returns the line to say last."""
    from fwk.data.fingerprint import of_image_folder
    from fwk.data.imagefolder import IMAGENET_MEAN, IMAGENET_STD, find_images

    if shards.is_remote(out):
        raise UserError(
            f"--out {out}: fwk data prepare writes a local folder; copy it to object storage afterwards "
            "(aws s3 sync DIR s3://bucket/prefix), then train with data.uri=s3://bucket/prefix"
        )
    if not 16 <= max_side <= 4096 or not 1 <= quality <= 100:
        raise UserError(f"--max-side {max_side} --quality {quality}: expected 16-4096 px and a JPEG quality of 1-100")
    root = os.path.expanduser(cfg.root)
    classes, train, val = find_images(cfg.root)
    source = of_image_folder(Path(root))
    wanted = {
        "format": shards.FORMAT,
        "source": {"digest": source.digest, "what": source.what},
        "settings": {"max_side": max_side, "quality": quality},
    }
    target = Path(os.path.expanduser(out)).resolve()
    if _check_out(target, wanted, say):
        found = json.loads((target / shards.MANIFEST).read_text())
        return f"already prepared: {target} ({shards.describe(found)})"
    target.mkdir(parents=True, exist_ok=True)
    write_atomic(target / MARKER, json.dumps(wanted) + "\n")
    import litdata

    t0 = time.perf_counter()
    fn = functools.partial(encode, max_side=max_side, quality=quality)
    counts = {}
    for split, (paths, labels) in zip(SPLITS, (train, val), strict=True):
        items = [
            (os.path.join(root, split, p), label, i) for i, (p, label) in enumerate(zip(paths, labels, strict=True))
        ]
        say(f"{split}: {len(items):,} images -> {target / split} ({workers} workers)")
        litdata.optimize(
            fn=fn,
            inputs=items,
            output_dir=str(target / split),
            chunk_bytes="64MB",
            num_workers=workers,
            mode="overwrite",
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
