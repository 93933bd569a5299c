"""The fingerprint of a large image folder, cached per folder.

Fingerprinting an image folder stats every file (``sources.of_files``). That takes seconds for
ImageNet's 1.28M files, on every ``fwk train``, an already complete run's included. The
fingerprint is kept in ``$XDG_CACHE_HOME/fwk/fingerprints/`` beside the modification
times and sizes of the folder and of every folder below it. A later call stats only those
folders. Adding, removing or renaming a file changes its folder's mtime, so the cached
fingerprint is used only while none changed. A file rewritten in place keeps its folder's
mtime, so touch the folder, or delete the cache file, after editing images in place.
This module is torch-free, as the rest of the launcher's data code.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from fwk.data import sources
from fwk.data.sources import Fingerprint
from fwk.track.store import cache_root, write_atomic

VERSION = 1  # of the cache file's layout


def _cache_file(root: Path) -> Path:
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return cache_root() / "fingerprints" / f"{key}.json"


def _folders(root: Path, splits: tuple[str, ...]) -> dict[str, list[int]]:
    """Return the stamps of the root and every folder below its splits: relative path -> [mtime_ns, size]."""
    out = {".": _stamp(root)}
    for split in splits:
        for dirpath, _, _ in os.walk(root / split):
            out[Path(dirpath).relative_to(root).as_posix()] = _stamp(Path(dirpath))
    return out


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_mtime_ns, st.st_size]


def _unchanged(root: Path, folders: dict[str, list[int]]) -> bool:
    try:
        return all(_stamp(root / rel) == stamp for rel, stamp in folders.items())
    except OSError:  # a folder the cache names is gone
        return False


def of_image_folder(root: Path, splits: tuple[str, ...] = ("train", "val")) -> Fingerprint:
    """Return the fingerprint of the image files of ``splits`` under ``root``: names, sizes, mtimes.

    It comes from the cache while no folder changed. ``how`` says whether it did."""
    cache = _cache_file(root)
    try:
        kept = json.loads(cache.read_text())
    except (OSError, ValueError):
        kept = {}
    if kept.get("version") == VERSION and kept.get("splits") == list(splits) and _unchanged(root, kept["folders"]):
        return Fingerprint(kept["digest"], kept["what"], f"from the cache ({cache}): no folder changed since")
    t0 = time.perf_counter()
    files = [f for split in splits for f in sources.walk(root / split, sources.IMAGE_EXTENSIONS)]
    found = sources.of_files(root, files)
    folders = _folders(root, splits)  # after the walk: a file added meanwhile shows up next time
    seconds = time.perf_counter() - t0
    record = {"version": VERSION, "splits": list(splits), "digest": found.digest, "what": found.what}
    record["folders"] = folders
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps(record) + "\n")
        kept_in = f"cached in {cache}"
    except OSError as exc:  # a read-only home: fingerprint every time, say why
        kept_in = f"not cached ({exc.strerror or exc})"
    return Fingerprint(found.digest, found.what, f"recomputed in {seconds:.2f} s ({len(files):,} files), {kept_in}")
