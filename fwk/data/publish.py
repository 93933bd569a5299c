"""Publishing for ``fwk data prepare --out s3://bucket/prefix``.

The set is prepared in a local staging folder, then uploaded with boto3, the manifest last.

A remote set is finished when its ``fwk-manifest.json`` is there, as a local one is. The
chunks and indexes go up first, and the manifest after them, so a reader never sees a set
that looks whole and is not. A rerun finds a finished set with the same source and settings
and says so. One with other source or settings is refused. A prefix without a manifest, left
by an interrupted upload or holding nothing yet, is written, again if need be. Before any
image is encoded, a marker object (``.fwk-preparing``) is written there. So credentials that
may read but not write fail in seconds, not after hours of encoding. The staging folder,
``$XDG_CACHE_HOME/fwk/prepare/`` with one per destination, is kept until the upload has
finished, then removed. So an upload interrupted after the images were encoded restarts at
the upload.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fwk.data import shards
from fwk.data.shards import MARKER
from fwk.track.store import cache_root

logger = logging.getLogger(__name__)


def staging_dir(uri: str) -> Path:
    return cache_root() / "prepare" / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]


def publish(uri: str, endpoint_url: str, wanted: dict[str, Any], write: Callable[[Path], str]) -> str:
    """Prepare into the staging folder (``write``) unless it holds this set, then upload it."""
    found = shards.s3_manifest(uri, endpoint_url, label="--out")
    if found is not None and shards.same_set(found, wanted, uri):
        return f"already prepared: {uri} ({shards.describe(found)})"
    client, bucket, prefix, where = shards.s3_client(uri, endpoint_url)
    with shards.s3_errors("--out", uri, bucket, where):  # can we write there? (before hours of encoding)
        client.put_object(Bucket=bucket, Key=_key(prefix, MARKER), Body=json.dumps(wanted).encode())
    staging = staging_dir(uri)
    with _only_writer(staging, uri):
        return _stage_and_upload(uri, endpoint_url, wanted, write, staging)


@contextlib.contextmanager
def _only_writer(staging: Path, uri: str) -> Iterator[None]:
    """Allow one prepare at a time per destination on this machine.

    A second would clear the first's staging folder. Two machines writing one prefix are not
    detected."""
    import fcntl

    from fwk.errors import UserError

    staging.parent.mkdir(parents=True, exist_ok=True)
    with open(staging.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"--out {uri}: another fwk data prepare is writing it on this machine; wait for it"
            ) from None
        yield


def _stage_and_upload(
    uri: str,
    endpoint_url: str,
    wanted: dict[str, Any],
    write: Callable[[Path], str],
    staging: Path,
) -> str:
    client, bucket, prefix, where = shards.s3_client(uri, endpoint_url)
    manifest = staging / shards.MANIFEST
    if manifest.is_file() and {k: json.loads(manifest.read_text()).get(k) for k in wanted} == wanted:
        logger.info(f"{staging}: already prepared there; uploading it")
    else:
        shutil.rmtree(staging, ignore_errors=True)  # fwk's own folder: anything else in it is stale
        logger.info(write(staging))
    line = _upload(staging, uri, endpoint_url)
    with shards.s3_errors("--out", uri, bucket, where):
        client.delete_object(Bucket=bucket, Key=_key(prefix, MARKER))
    shutil.rmtree(staging, ignore_errors=True)  # uploaded: a rerun finds the remote manifest
    return line


def _key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}".lstrip("/")


def _upload(folder: Path, uri: str, endpoint_url: str) -> str:
    client, bucket, prefix, where = shards.s3_client(uri, endpoint_url)
    skip = {shards.MANIFEST, MARKER}
    files = sorted(f for f in folder.rglob("*") if f.is_file() and f.name not in skip)
    files.append(folder / shards.MANIFEST)  # last: the set is finished once it is there
    size = sum(f.stat().st_size for f in files)
    logger.info(f"uploading {len(files)} files ({size / 1e6:,.1f} MB) to {where}")
    t0 = time.perf_counter()
    with shards.s3_errors("--out", uri, bucket, where):
        for f in files:
            client.upload_file(str(f), bucket, _key(prefix, f.relative_to(folder).as_posix()))
    seconds = time.perf_counter() - t0
    manifest = json.loads((folder / shards.MANIFEST).read_text())
    return f"prepared {uri}: {shards.describe(manifest)}; uploaded {size / 1e6:,.1f} MB in {seconds:.1f} s"
