"""Loaders that know their position: a stopped run resumes on the next unseen batch.

Training order comes from ``DistributedSampler`` (seeded, reshuffled per epoch, one
shard per rank). The position is (epoch, batches yielded in this epoch); on resume the
sampler skips the indices of the batches already consumed, without loading them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, Subset

from fwk.config.schema import LoaderConfig


class _Skip(Sampler[int]):
    """The sampler's indices from the ``start``-th on."""

    def __init__(self, sampler: Sampler[int], start: int) -> None:
        self.sampler, self.start = sampler, start

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.start, None)

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.start)  # type: ignore[arg-type]


def _loader_kwargs(cfg: LoaderConfig, cuda: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"num_workers": cfg.num_workers, "pin_memory": cfg.pin_memory and cuda}
    if cfg.num_workers > 0:
        kwargs["prefetch_factor"] = cfg.prefetch_factor
    return kwargs


class TrainLoader:
    """An endless iterator of training batches for this rank, resumable by state_dict."""

    def __init__(
        self, dataset: Dataset, batch_size: int, rank: int, world_size: int, seed: int, cfg: LoaderConfig, cuda: bool
    ) -> None:
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self.kwargs = _loader_kwargs(cfg, cuda)
        self.epoch, self.batch_in_epoch = 0, 0
        if self.batches_per_epoch == 0:
            from fwk.errors import UserError

            raise UserError(
                f"train.batch_size gives {batch_size} samples per rank but each rank has only "
                f"{len(self.sampler)} training samples; lower train.batch_size"
            )

    @property
    def batches_per_epoch(self) -> int:
        return len(self.sampler) // self.batch_size

    def __iter__(self) -> Iterator[Any]:
        while True:
            self.sampler.set_epoch(self.epoch)
            if hasattr(self.dataset, "set_epoch"):
                self.dataset.set_epoch(self.epoch)
            # The loader's own generator (seeded by epoch) seeds its workers, so creating a
            # loader mid-epoch on resume draws nothing from the global RNG.
            generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            loader = DataLoader(
                self.dataset,
                batch_size=self.batch_size,
                sampler=_Skip(self.sampler, self.batch_in_epoch * self.batch_size),
                drop_last=True,
                generator=generator,
                **self.kwargs,
            )
            for batch in loader:
                self.batch_in_epoch += 1
                yield batch
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])


def val_loader(
    dataset: Dataset, batch_size: int, rank: int, world_size: int, cfg: LoaderConfig, cuda: bool
) -> DataLoader:
    """This rank's strided shard of the validation set: no padding, no duplicates."""
    shard = Subset(dataset, range(rank, len(dataset), world_size))  # type: ignore[arg-type]
    return DataLoader(shard, batch_size=batch_size, shuffle=False, **_loader_kwargs(cfg, cuda))
