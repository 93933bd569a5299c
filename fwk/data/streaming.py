"""A set prepared by ``fwk data prepare``, read through litdata for ``data=streaming``.

Training streams ``train/`` with litdata's ``StreamingDataset`` and ``StreamingDataLoader``.
Each rank reads its own share of the chunks, as litdata shards by torch.distributed's rank
and world size. It reads them in an order shuffled from the run's seed, chunk by chunk, so a
remote set is downloaded once per epoch into a local cache of bounded size, not item by
item. Each image is decoded, a JPEG or the raw pixels of a small one, and cropped and
flipped as an image folder's are. Its random draws are seeded from the run seed, the epoch
and the item's index in the set, so the same item gets the same crop whatever the worker
that loads it.

On resume, ``StreamLoader``'s state is litdata's, which resumes mid-epoch exactly with the
same world size and number of workers. With other ones, the run resumes at the start of the
next epoch and says so in one line. Validation reads ``val/`` by index, in order.

litdata's reader downloads chunks in a thread of the process that made it. A forked loader
worker gets a copy of the reader without the thread, which would wait for chunks nobody
fetches, then fail with litdata's ChunkWaitTimeoutError. A streamed set therefore reads in a
process only through a reader made in that process. litdata's own loader makes one in each
worker. A set read by index, for validation and BatchNorm calibration, drops a reader it
inherited. ``loader=auto`` times its worker counts on throwaway ``StreamingDataLoader``s over
their own copies of the set (``DataBundle.trial_loader``).

Some chunks end the run in one line naming the chunk and the endpoint (``LoadError``). They
are a chunk that does not arrive within litdata's wait, ``MAX_WAIT_TIME`` seconds with 120 by
default, and a chunk that litdata's downloader gives up on after the S3 client's retries.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import torch
from litdata import ChunkWaitTimeoutError, StreamingDataLoader, StreamingDataset
from torch.utils.data import Dataset

from fwk.data.base import DataBundle, item_seed
from fwk.data.configs import ImageFolderConfig, StreamingConfig
from fwk.data.images import decode_bytes, seeded_cpu_rng
from fwk.data.loader import LoadError
from fwk.data.registry import register_data
from fwk.data.shards import check_fields, is_remote, read_manifest, storage_options
from fwk.errors import UserError
from fwk.track.store import cache_root

logger = logging.getLogger(__name__)

for _name in ("litdata", "botocore.credentials"):  # their per-worker info lines ("Found credentials ...")
    logging.getLogger(_name).setLevel(logging.WARNING)


_CRASHED = "Chunk prefetch thread crashed while waiting for "  # litdata's reader, when its download thread died


class StreamingImages(StreamingDataset):
    """The items of a prepared split, each an image and its label.

    The image is a normalized float32 (3, S, S). ``source`` and ``endpoint`` name the set and its
    server in messages."""

    def __init__(
        self,
        uri: str,
        transform: Callable[[torch.Tensor], torch.Tensor],
        random: bool,
        seed: int,
        source: str,
        endpoint: str,
        **kwargs: Any,
    ) -> None:
        try:
            super().__init__(uri, shuffle=random, seed=seed, drop_last=random, **kwargs)
        except json.JSONDecodeError:  # litdata read a damaged index.json: the set's is checked, so its cache's
            where = kwargs.get("cache_dir", uri)
            raise UserError(f"{source}: an index.json cached in {where} is not a litdata index; delete it") from None
        if self.input_dir.url:  # litdata reads a remote split's index.json from its cache, once it is there
            self.check_cached_index(source)
        self.image_transform, self.random, self.run_seed = transform, random, seed
        self.source, self.endpoint, self.reader_pid = source, endpoint, os.getpid()
        self._on_demand_bytes = False  # read by index (validation): whole chunks into the cache, not byte ranges

    def check_cached_index(self, source: str) -> None:
        """Refuse a cached index.json that declares a serializer fwk does not read, as the server's
        own is refused (``fwk.data.shards.check_fields``): whoever can write the cache folder
        (``data.cache_dir``, perhaps shared) could otherwise name "pickle" there."""
        path = os.path.join(self.input_dir.path, "index.json")
        split = self.input_dir.url.rstrip("/").rsplit("/", 1)[-1]
        try:
            with open(path) as f:
                index = json.load(f)
            index["config"]["data_format"]  # noqa: B018  (a KeyError or TypeError: not litdata's index)
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError):
            raise UserError(
                f"{source}: the cached {path} is not a litdata index; delete it to fetch it again"
            ) from None  # noqa: E501
        uri = f"{source.removeprefix('data.uri=')} (cached in {self.input_dir.path})"
        check_fields(uri, split, index, f"delete {self.input_dir.path} to fetch the set's own index again")

    def __iter__(self) -> StreamingImages:
        super().__iter__()  # a reader of this process (a loader worker's own)
        self.reader_pid = os.getpid()
        return self

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, int]:
        if self.reader_pid != os.getpid():  # a forked copy of another process's reader, without its download thread
            self.cache, self.reader_pid = None, os.getpid()  # litdata makes this process its own
        try:
            item = super().__getitem__(index)
        except ChunkWaitTimeoutError as exc:
            raise LoadError(self.stalled(exc)) from None
        except RuntimeError as exc:  # litdata's download thread died (after its retries): it says what killed it
            if exc.__cause__ is None or not str(exc).startswith(_CRASHED):
                raise
            chunk = str(exc).removeprefix(_CRASHED).split(". Original error: ")[0]
            raise LoadError(self.failed(chunk, exc.__cause__)) from None
        image = decode_bytes(torch.frombuffer(bytearray(item["image"]), dtype=torch.uint8))  # (3, H, W) uint8
        if self.random:
            with seeded_cpu_rng(item_seed(self.run_seed, self.current_epoch, int(item["index"]))):
                image = self.image_transform(image)
        else:
            image = self.image_transform(image)
        return image, int(item["label"])

    def stalled(self, exc: ChunkWaitTimeoutError) -> str:
        if self.input_dir.url:
            return (
                f"{self.source}: chunk {self.remote(exc.path)} did not arrive from {self.endpoint} in "
                f"{exc.waited_s:.0f} s (the server stalled or is unreachable); check it, or set "
                "MAX_WAIT_TIME=<seconds> (litdata's wait) to wait longer"
            )
        return f"{self.source}: chunk {exc.path} is missing; prepare the set again (fwk data prepare)"

    def failed(self, path: str, cause: BaseException) -> str:
        why = textwrap.shorten(str(cause).split("\n", 1)[0], 240)  # obstore's errors go on for pages
        return (
            f"{self.source}: chunk {self.remote(path)} could not be read from {self.endpoint} "
            f"({type(cause).__name__}: {why}); check the server"
        )

    def remote(self, path: str) -> str:
        """Return the chunk's address in the set: its cache ``path``'s name under the split's URI."""
        return f"{(self.input_dir.url or self.input_dir.path or '').rstrip('/')}/{os.path.basename(path)}"


class ByIndex(Dataset):
    """A prepared split read by global index, in any order, for validation.

    Every rank has the whole split, and the loop's own sharding picks this rank's items."""

    def __init__(self, images: StreamingImages, count: int) -> None:
        self.images, self.count = images, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index]


class StreamLoader:
    """This rank's endless training batches through litdata's StreamingDataLoader.

    Its state is litdata's, with the world size and workers it was taken with."""

    def __init__(
        self,
        dataset: StreamingImages,
        batch_size: int,
        world_size: int,
        kwargs: dict[str, Any],
        collate: Callable[[list[Any]], Any] | None,
    ) -> None:
        self.world_size, self.workers = world_size, int(kwargs.get("num_workers", 0))
        self.batch_size, self.source = batch_size, dataset.source
        self.loader = stream(dataset, batch_size, kwargs, collate)

    def __iter__(self) -> Iterator[Any]:
        empty = 0
        while True:  # each pass over the loader is one epoch
            got = 0
            for batch in self.loader:
                got += 1
                yield batch
            empty = 0 if got else empty + 1
            if empty == 2:  # (one may be the rest of an epoch a resumed run had finished)
                raise UserError(
                    f"{self.source}: an epoch gives no full batch of {self.batch_size} to any of this rank's "
                    f"{max(self.workers, 1)} readers (litdata splits a rank's items among its workers); lower "
                    "train.batch_size or loader.num_workers"
                )

    def state_dict(self) -> dict[str, Any]:
        return {"litdata": self.loader.state_dict(), "world_size": self.world_size, "num_workers": self.workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["world_size"], state["num_workers"]) == (self.world_size, self.workers):
            self.loader.load_state_dict(state["litdata"])
            return
        epoch = int(state["litdata"]["current_epoch"])
        self.loader.current_epoch = epoch  # the next pass is the next epoch
        logger.info(
            f"data=streaming: the checkpoint was taken with {state['world_size']} processes x {state['num_workers']} "
            f"workers, this run has {self.world_size} x {self.workers}; resuming at the start of epoch {epoch + 1} "
            f"(the rest of epoch {epoch} is skipped)"
        )


def stream(
    dataset: StreamingImages, batch_size: int, kwargs: dict[str, Any], collate: Callable[[list[Any]], Any] | None
) -> StreamingDataLoader:
    """Return litdata's loader of ``dataset``, with fwk's loader settings."""
    kwargs = {k: v for k, v in kwargs.items() if k != "persistent_workers"}  # litdata restarts them per epoch
    # Its own generator seeds the workers: starting an epoch (or a resumed run) draws nothing
    # from the run's random streams.
    generator = torch.Generator().manual_seed(dataset.run_seed)
    return StreamingDataLoader(
        dataset, batch_size=batch_size, drop_last=True, collate_fn=collate, generator=generator, **kwargs
    )


def _cache(cfg: StreamingConfig) -> dict[str, Any]:
    """Return litdata's options: a remote set's endpoint and local cache, and the cache's size limit."""
    limit = {"max_cache_size": f"{cfg.max_cache_gb:g}GB"}
    if not is_remote(cfg.uri):
        return limit
    options = storage_options(cfg.endpoint_url)
    if options.get("endpoint_url", "").startswith("http://"):
        _allow_http()
    _quiet_crash_reports()
    folder = cfg.cache_dir or str(cache_root() / "streaming" / hashlib.sha256(cfg.uri.encode()).hexdigest()[:16])
    return {
        "storage_options": options,
        "cache_dir": os.path.expanduser(folder),
        **limit,
    }


def _allow_http() -> None:
    """Allow an S3-compatible endpoint over plain http, such as MinIO or a server on loopback.

    litdata's chunk prefetcher, obstore, refuses http URLs unless its client allows them, and
    litdata passes no such option. Its shared client options get it here. https is unaffected."""
    from litdata.streaming import downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        options["allow_http"] = "true"


def _quiet_crash_reports() -> None:
    """Leave out the traceback litdata's download thread prints when an error kills it.

    The error may be a server gone, after obstore's retries. The thread prints it to stderr,
    for loader workers that swallow logs. The reader then raises the same error where the item
    is read, which fwk says in one line (``StreamingImages.failed``)."""
    from litdata.streaming.reader import PrepareChunksThread

    PrepareChunksThread._report_crash = _unreported  # type: ignore[method-assign]


def _unreported(thread: Any, exc: BaseException) -> None:
    pass


def _split(uri: str, split: str) -> str:
    return f"{uri.rstrip('/')}/{split}" if is_remote(uri) else os.path.join(os.path.expanduser(uri), split)


@contextlib.contextmanager
def _one_at_a_time(options: dict[str, Any]) -> Iterator[None]:
    """Make the ranks of a machine open a remote set one after another.

    litdata fetches each split's index.json into the shared cache under a lock it waits one
    second for. A rank that waits longer goes on without the file ("doesn't contain any
    index.json")."""
    if "cache_dir" not in options:
        yield
        return
    os.makedirs(options["cache_dir"], exist_ok=True)
    with open(os.path.join(options["cache_dir"], ".fwk-open.lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


@register_data(StreamingConfig)
def streaming(cfg: StreamingConfig, *, seed: int) -> DataBundle:
    from fwk.data.imagefolder import train_transform, val_transform

    manifest = read_manifest(cfg.uri, cfg.endpoint_url)
    like = ImageFolderConfig(
        image_size=cfg.image_size, val_resize=cfg.val_resize, min_scale=cfg.min_scale, hflip=cfg.hflip
    )
    options = _cache(cfg)
    named = {"source": f"data.uri={cfg.uri}", "endpoint": storage_options(cfg.endpoint_url).get("endpoint_url", "AWS")}

    def train_split() -> StreamingImages:
        return StreamingImages(_split(cfg.uri, "train"), train_transform(like), True, seed, **named, **options)

    with _one_at_a_time(options):
        train = train_split()
        val_images = StreamingImages(_split(cfg.uri, "val"), val_transform(like), False, seed, **named, **options)
    mean, std = tuple(manifest["mean"]), tuple(manifest["std"])
    return DataBundle(
        train=train,
        val=ByIndex(val_images, manifest["counts"]["val"]),
        task="classification",
        num_classes=len(manifest["classes"]),
        mean=mean,
        std=std,
        # litdata takes the rank from torch.distributed
        train_loader=lambda batch, world, kwargs, collate, rank: StreamLoader(train, batch, world, kwargs, collate),
        # a copy of the training split, read as the run reads it (its index.json is in the cache by now)
        trial_loader=lambda batch, kwargs, collate: stream(train_split(), batch, kwargs, collate),
    )
