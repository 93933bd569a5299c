"""``fwk data prepare --out s3://bucket/prefix``: prepared in a local staging folder, then
uploaded with boto3, the manifest last.

A remote set is finished when its ``fwk-manifest.json`` is there, as a local one is: the
chunks and indexes go up first, the manifest after them, so a reader never sees a set that
looks whole and is not. A rerun finds a finished set with the same source and settings and
says so; one with others is refused; a prefix without a manifest (an interrupted upload, or
nothing yet) is written (again). The staging folder (``$XDG_CACHE_HOME/fwk/prepare/``, one per
destination) is kept: an upload interrupted after the images were encoded restarts at the
upload.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fwk.data import shards
from fwk.track.store import cache_root


def staging_dir(uri: str) -> Path:
    return cache_root() / "prepare" / hashlib.sha256(uri.encode()).hexdigest()[:16]


def publish(
    uri: str, endpoint_url: str, wanted: dict[str, Any], write: Callable[[Path], str], say: Callable[[str], None]
) -> str:
    """Prepare into the staging folder (``write``) unless it holds this set, then upload it."""
    from fwk.errors import UserError

    found = shards.s3_manifest(uri, endpoint_url, label="--out")
    if found is not None:
        if {k: found.get(k) for k in wanted} == wanted:
            return f"already prepared: {uri} ({shards.describe(found)})"
        raise UserError(
            f"--out {uri} holds another prepared set ({shards.describe(found)}); choose another prefix, or delete "
            "it to prepare this one there"
        )
    staging = staging_dir(uri)
    manifest = staging / shards.MANIFEST
    if not (manifest.is_file() and {k: json.loads(manifest.read_text()).get(k) for k in wanted} == wanted):
        shutil.rmtree(staging, ignore_errors=True)  # fwk's own folder: anything else in it is stale
        say(write(staging))
    else:
        say(f"{staging}: already prepared there; uploading it")
    return _upload(staging, uri, endpoint_url, say)


def _upload(folder: Path, uri: str, endpoint_url: str, say: Callable[[str], None]) -> str:
    client, bucket, prefix, where = shards.s3_client(uri, endpoint_url)
    files = sorted(f for f in folder.rglob("*") if f.is_file() and f.name != shards.MANIFEST)
    files.append(folder / shards.MANIFEST)  # last: the set is finished once it is there
    size = sum(f.stat().st_size for f in files)
    say(f"uploading {len(files)} files ({size / 1e6:,.1f} MB) to {where}")
    t0 = time.perf_counter()
    with shards.s3_errors("--out", uri, bucket, where):
        for f in files:
            client.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(folder).as_posix()}".lstrip("/"))
    seconds = time.perf_counter() - t0
    manifest = json.loads((folder / shards.MANIFEST).read_text())
    return f"prepared {uri}: {shards.describe(manifest)}; uploaded {size / 1e6:,.1f} MB in {seconds:.1f} s"
