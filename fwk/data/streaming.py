"""``data=streaming``: a prepared set (``fwk data prepare``) read through litdata.

Training streams ``train/`` with litdata's ``StreamingDataset`` and ``StreamingDataLoader``:
each rank reads its own share of the chunks (litdata shards by torch.distributed's rank
and world size), in an order shuffled from the run's seed, chunk by chunk, so a remote set
is downloaded once per epoch into a local cache of bounded size, not item by item. Each
image is decoded (a JPEG, or the raw pixels of a small one) and cropped and flipped as an
image folder's are, its random draws seeded from (run seed, epoch, the item's index in the
set): the same item gets the same crop whatever the worker that loads it.

Resume: ``StreamLoader``'s state is litdata's, which resumes mid-epoch exactly with the
same world size and number of workers; with other ones, the run resumes at the start of
the next epoch and says so in one line. Validation reads ``val/`` by index, in order.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from litdata import StreamingDataLoader, StreamingDataset
from torch.utils.data import Dataset

from fwk.data.base import DataBundle, item_seed
from fwk.data.configs import ImageFolderConfig, StreamingConfig
from fwk.data.images import decode_bytes, seeded_cpu_rng
from fwk.data.registry import register_data
from fwk.data.shards import is_remote, read_manifest, storage_options
from fwk.track.store import cache_root

for _name in ("litdata", "botocore.credentials"):  # their per-worker info lines ("Found credentials ...")
    logging.getLogger(_name).setLevel(logging.WARNING)


class StreamingImages(StreamingDataset):
    """Items of a prepared split as (image (3, S, S) float32 normalized, label)."""

    def __init__(
        self, uri: str, transform: Callable[[torch.Tensor], torch.Tensor], random: bool, seed: int, **kwargs: Any
    ) -> None:
        super().__init__(uri, shuffle=random, seed=seed, drop_last=random, **kwargs)
        self.image_transform, self.random, self.run_seed = transform, random, seed
        self._on_demand_bytes = False  # read by index (validation): whole chunks into the cache, not byte ranges

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, int]:
        item = super().__getitem__(index)
        image = decode_bytes(torch.frombuffer(bytearray(item["image"]), dtype=torch.uint8))  # (3, H, W) uint8
        if self.random:
            with seeded_cpu_rng(item_seed(self.run_seed, self.current_epoch, int(item["index"]))):
                image = self.image_transform(image)
        else:
            image = self.image_transform(image)
        return image, int(item["label"])


class ByIndex(Dataset):
    """A prepared split read by global index, in any order (validation; the whole split on
    every rank: the loop's own sharding picks this rank's items)."""

    def __init__(self, images: StreamingImages, count: int) -> None:
        self.images, self.count = images, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index]


class StreamLoader:
    """Endless training batches of this rank through litdata's StreamingDataLoader; its
    state is litdata's, with the world size and workers it was taken with."""

    def __init__(
        self,
        dataset: StreamingImages,
        batch_size: int,
        world_size: int,
        kwargs: dict[str, Any],
        collate: Callable[[list[Any]], Any] | None,
        say: Callable[[str], None],
    ) -> None:
        self.world_size, self.workers, self.say = world_size, int(kwargs.get("num_workers", 0)), say
        kwargs = {k: v for k, v in kwargs.items() if k != "persistent_workers"}  # litdata restarts them per epoch
        self.loader = StreamingDataLoader(dataset, batch_size=batch_size, drop_last=True, collate_fn=collate, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        while True:  # each pass over the loader is one epoch
            yield from self.loader

    def state_dict(self) -> dict[str, Any]:
        return {"litdata": self.loader.state_dict(), "world_size": self.world_size, "num_workers": self.workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["world_size"], state["num_workers"]) == (self.world_size, self.workers):
            self.loader.load_state_dict(state["litdata"])
            return
        epoch = int(state["litdata"]["current_epoch"])
        self.loader.current_epoch = epoch  # the next pass is the next epoch
        self.say(
            f"data=streaming: the checkpoint was taken with {state['world_size']} processes x {state['num_workers']} "
            f"workers, this run has {self.world_size} x {self.workers}; resuming at the start of epoch {epoch + 1} "
            f"(the rest of epoch {epoch} is skipped)"
        )


def _cache(cfg: StreamingConfig) -> dict[str, Any]:
    """litdata's options: a remote set's endpoint and local cache; the cache's size limit."""
    limit = {"max_cache_size": f"{cfg.max_cache_gb:g}GB"}
    if not is_remote(cfg.uri):
        return limit
    options = storage_options(cfg.endpoint_url)
    if options.get("endpoint_url", "").startswith("http://"):
        _allow_http()
    folder = cfg.cache_dir or str(cache_root() / "streaming" / hashlib.sha256(cfg.uri.encode()).hexdigest()[:16])
    return {
        "storage_options": options,
        "cache_dir": os.path.expanduser(folder),
        **limit,
    }


def _allow_http() -> None:
    """An S3-compatible endpoint over plain http (MinIO, a server on loopback): litdata's
    chunk prefetcher (obstore) refuses http URLs unless its client allows them, and litdata
    passes no such option; its shared client options get it here (https is unaffected)."""
    from litdata.streaming import downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        options["allow_http"] = "true"


def _split(uri: str, split: str) -> str:
    return f"{uri.rstrip('/')}/{split}" if is_remote(uri) else os.path.join(os.path.expanduser(uri), split)


@register_data(StreamingConfig)
def streaming(cfg: StreamingConfig, *, seed: int) -> DataBundle:
    from fwk.data.imagefolder import train_transform, val_transform

    manifest = read_manifest(cfg.uri, cfg.endpoint_url)
    like = ImageFolderConfig(
        image_size=cfg.image_size, val_resize=cfg.val_resize, min_scale=cfg.min_scale, hflip=cfg.hflip
    )
    options = _cache(cfg)
    train = StreamingImages(_split(cfg.uri, "train"), train_transform(like), True, seed, **options)
    val = ByIndex(
        StreamingImages(_split(cfg.uri, "val"), val_transform(like), False, seed, **options), manifest["counts"]["val"]
    )
    mean, std = tuple(manifest["mean"]), tuple(manifest["std"])
    return DataBundle(
        train=train,
        val=val,
        task="classification",
        num_classes=len(manifest["classes"]),
        mean=mean,
        std=std,
        train_loader=lambda batch, world, kwargs, collate, say: StreamLoader(train, batch, world, kwargs, collate, say),
    )
