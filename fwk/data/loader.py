"""Loaders that know their position: a stopped run resumes on the next unseen batch.

Training order comes from ``DistributedSampler``: seeded, reshuffled per epoch, one shard per
rank. The position is the epoch and the batches yielded in this epoch. On resume the sampler
skips the indices of the batches already consumed, without loading them.

One ``DataLoader`` serves every epoch, so persistent workers outlive an epoch. Its sampler
hands out ``(epoch, index)`` keys. So the epoch reaches ``set_epoch`` of the data set copy in
each worker with the item, not through the main process's copy, which workers never see.

Their settings (``LoaderPlan``: workers, pinning, prefetch) are decided in
``fwk/data/loader_plan.py``.

An item that cannot be loaded is a ``LoadError``: one line, whether it was raised here or
in a loader worker.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler, Sampler, Subset

from fwk.data.base import DataBundle
from fwk.data.loader_plan import LoaderPlan, loader_kwargs
from fwk.errors import UserError


class LoadError(UserError):
    """The error of an item that cannot be loaded, such as a remote read that stalled, in one line.

    torch re-raises a loader worker's exception in the training process as
    ``type(exc)(text)``. The text is "Caught LoadError in DataLoader worker process N." and the
    worker's traceback, whose last line is ``module.LoadError: <the line>``. That line is kept
    alone, so a worker's error reads as the training process's would."""

    def __init__(self, line: str) -> None:
        if line.startswith(f"Caught {type(self).__name__} "):
            line = line.rstrip().rsplit("\n", 1)[-1].split(": ", 1)[-1]
        super().__init__(line)


class _Keys(Sampler[tuple[int, int]]):
    """The ``(epoch, index)`` sampler of ``epoch``'s indices, from the ``start``-th to the ``end``-th."""

    def __init__(self, sampler: DistributedSampler, end: int) -> None:
        self.sampler, self.epoch, self.start, self.end = sampler, 0, 0, end

    def __iter__(self) -> Iterator[tuple[int, int]]:
        self.sampler.set_epoch(self.epoch)
        return ((self.epoch, i) for i in itertools.islice(iter(self.sampler), self.start, self.end))

    def __len__(self) -> int:
        return max(0, self.end - self.start)


class _ByEpoch(Dataset):
    """The data set indexed by ``(epoch, index)``, which is told the epoch before the item."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset, self.epoch = dataset, None
        self.set_epoch = getattr(dataset, "set_epoch", None)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        if self.set_epoch is not None and epoch != self.epoch:
            self.set_epoch(epoch)
            self.epoch = epoch
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


class TrainLoader:
    """An endless iterator of training batches for this rank, resumable by state_dict.

    The order is global. Each epoch is one permutation of the sample ids, drawn from the seed
    and the epoch. Each optimizer step takes its next global batch (per-rank batch x world
    size x accumulation), and each rank its strided part. An epoch ends at the last whole step.
    So any split of one global batch sees the same samples at every step, and resumes from
    any other's position."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        plan: LoaderPlan,
        collate: Callable[[list[Any]], Any] | None = None,
        accum_steps: int = 1,
    ) -> None:
        self.dataset, self.batch_size, self.seed, self.collate = dataset, batch_size, seed, collate
        self.world_size = world_size
        self.sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self.kwargs = loader_kwargs(plan)
        self.epoch, self.batch_in_epoch = 0, 0
        step = batch_size * world_size * accum_steps  # the global batch; an epoch holds whole steps only
        self.batches_per_epoch = len(dataset) // step * accum_steps  # type: ignore[arg-type]
        if self.batches_per_epoch == 0:
            raise UserError(
                f"a step takes {step} training samples (train.batch_size={batch_size} x {world_size} process(es) x "
                f"{accum_steps} accumulated) but the training set has {len(dataset)}; lower train.batch_size"  # type: ignore[arg-type]
            )

    def __iter__(self) -> Iterator[Any]:
        keys = _Keys(self.sampler, self.batches_per_epoch * self.batch_size)
        # The loader's own generator seeds its workers, so creating the loader on resume
        # draws nothing from the global RNG. Re-seeded per epoch: workers that are started
        # anew each epoch (persistent_workers=false) get the seeds of an uninterrupted run.
        generator = torch.Generator()
        loader = DataLoader(
            _ByEpoch(self.dataset),
            batch_size=self.batch_size,
            sampler=keys,
            drop_last=True,
            generator=generator,
            collate_fn=self.collate,
            **self.kwargs,
        )
        while True:
            keys.epoch, keys.start = self.epoch, self.batch_in_epoch * self.batch_size
            generator.manual_seed(self.seed * 100_003 + self.epoch)
            for batch in loader:
                self.batch_in_epoch += 1
                yield batch
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        samples = self.batch_in_epoch * self.batch_size * self.world_size  # global: any world size resumes it
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "samples_in_epoch": samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        per_batch = self.batch_size * self.world_size  # samples into the epoch: the same on any world size
        self.epoch = int(state["epoch"])
        self.batch_in_epoch = int(state.get("samples_in_epoch", int(state["batch_in_epoch"]) * per_batch)) // per_batch


def train_loader(
    data: DataBundle,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    plan: LoaderPlan,
    accum_steps: int = 1,
) -> Any:
    """Return this rank's endless, resumable training batches.

    They come from the data set's own loader where it streams (``DataBundle.train_loader``),
    else from a ``TrainLoader`` over its items."""
    if data.train_loader is not None:
        return data.train_loader(batch_size, world_size, loader_kwargs(plan), data.collate, rank)
    return TrainLoader(data.train, batch_size, rank, world_size, seed, plan, data.collate, accum_steps)


def val_loader(
    dataset: Dataset,
    batch_size: int,
    rank: int,
    world_size: int,
    plan: LoaderPlan,
    collate: Callable[[list[Any]], Any] | None = None,
) -> DataLoader:
    """Return a loader of this rank's strided shard of the validation set: no padding, no duplicates."""
    shard = Subset(dataset, range(rank, len(dataset), world_size))  # type: ignore[arg-type]
    kwargs = loader_kwargs(plan)
    if plan.num_workers > 0:
        kwargs["persistent_workers"] = plan.val_persistent_workers
    return DataLoader(shard, batch_size=batch_size, shuffle=False, collate_fn=collate, **kwargs)


def calibration_loader(
    dataset: Dataset,
    batch_size: int,
    seed: int,
    plan: LoaderPlan,
    collate: Callable[[list[Any]], Any] | None = None,
) -> Callable[[], Iterator[Any]]:
    """Return a function that gives training batches in one fixed shuffled order, starting over at each call.

    The order is the same on every rank and at every call. The batches recompute BatchNorm
    statistics before an evaluation. The loader is made at the first call, and most runs
    never make one. A streamed data set is read by index."""
    generator = torch.Generator()
    made: list[DataLoader] = []

    def batches() -> Iterator[Any]:
        if not made:
            items = Subset(dataset, range(len(dataset))) if isinstance(dataset, IterableDataset) else dataset  # type: ignore[arg-type]
            sampler = RandomSampler(items, generator=generator)  # type: ignore[arg-type]
            kwargs = {**loader_kwargs(plan), "persistent_workers": False}  # used a few batches at a time
            made.append(
                DataLoader(
                    items,
                    batch_size,
                    sampler=sampler,
                    generator=generator,
                    collate_fn=collate,
                    drop_last=True,
                    **kwargs,
                )
            )
        generator.manual_seed(seed)
        return iter(made[0])

    return batches
