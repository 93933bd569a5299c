"""What a rank's DataLoaders use (``LoaderPlan``), and how ``loader=auto`` decides it.

``decide`` fills what the config leaves unset:

- the workers, from the cores per rank. For data not in memory, a short measurement times
  three worker counts: none, the cores per rank minus one, and all of them. It runs on a
  throwaway loader of the kind that will read the data, made by ``trial``. Where the data set
  streams, that is its own ``DataBundle.trial_loader``. The measurement draws nothing from the
  run's random streams and leaves the run's own loader where it was.
- pinned memory with CUDA.
- a queue of at least four batches.
- persistent workers for training when there are workers. Evaluation's workers start for
  each evaluation and exit after it, unless ``loader.persistent_workers=true``.

The loaders themselves are in ``fwk/data/loader.py``.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from fwk.config.schema import LoaderConfig
from fwk.data.base import DataBundle

logger = logging.getLogger(__name__)

MAX_WORKERS = 16  # a cap per rank: each worker holds its own copy of the data set and its queued batches
MEASURE_S = 1.5  # the whole start-up measurement (three worker counts, their start included)
MEASURE_BATCH = 16  # at most this many items a batch: several batches fit the time of one count
IN_PROCESS_MARGIN = 2.0  # loading in the training process wins only when this many times faster
QUEUE = 4  # batches in flight that auto aims for: smooths one slow file or one slow step


@dataclass(frozen=True)
class LoaderPlan:
    """The DataLoader settings a rank uses, every one decided."""

    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int = 2
    persistent_workers: bool = False
    val_persistent_workers: bool = False  # evaluation's: started for each evaluation unless set true


def loader_kwargs(plan: LoaderPlan) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"num_workers": plan.num_workers, "pin_memory": plan.pin_memory}
    if plan.num_workers > 0:
        kwargs.update(
            prefetch_factor=plan.prefetch_factor,
            persistent_workers=plan.persistent_workers,
        )
    return kwargs


@dataclass(frozen=True)
class Host:
    """The facts auto decides from: usable cores, training processes on this machine, CUDA."""

    cores: int
    processes: int
    cuda: bool

    @classmethod
    def here(cls, cuda: bool) -> Host:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return cls(cores, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), cuda)  # torchrun sets it

    def __str__(self) -> str:
        procs = f"{self.processes} process" + "es" * (self.processes > 1)
        return f"{self.cores} core{'s' * (self.cores > 1)}, {procs}, {'CUDA' if self.cuda else 'CPU'}"


def worker_candidates(host: Host) -> tuple[int, int]:
    """Return the two worker counts to try, capped.

    They are the cores per rank minus one for the training process, and all cores per rank."""
    per_rank = min(MAX_WORKERS, max(1, host.cores // host.processes))
    return per_rank - 1, per_rank


def _switch(value: Any, auto: bool) -> bool:
    text = str(value).lower()
    return auto if text == "auto" else text == "true"


def decide(
    cfg: LoaderConfig, host: Host, in_memory: bool, measure: Callable[[int], float] | None = None
) -> tuple[LoaderPlan, str]:
    """Decide the settings, and return them with why.

    Values set in ``cfg`` win. ``measure(workers)`` returns the items/s of that worker count."""
    if cfg.num_workers >= 0:
        workers, why = cfg.num_workers, "num_workers as set"
    elif in_memory:
        workers, why = 0, "in-memory data: workers would only add copies between processes"
    else:
        workers, why = _measured(host, measure)
    pin = _switch(cfg.pin_memory, host.cuda) and host.cuda  # pinning helps only copies to a GPU
    prefetch = cfg.prefetch_factor or min(QUEUE, max(2, math.ceil(QUEUE / max(workers, 1))))
    persistent = _switch(cfg.persistent_workers, workers > 0) and workers > 0
    # evaluation runs every few hundred steps: its workers, kept, would hold their memory
    # (~250 MB each on a 2-core CPU with ResNet-50's image folder) through every step between
    val_persistent = _switch(cfg.persistent_workers, False) and workers > 0
    chosen = LoaderPlan(workers, pin, prefetch, persistent, val_persistent)
    return chosen, f"loader=auto: {describe(chosen)} ({host}; {why})"


def _measured(host: Host, measure: Callable[[int], float] | None) -> tuple[int, str]:
    low, high = worker_candidates(host)
    if measure is None:
        return low, f"{low} of {high} cores per rank, one left to the training process"
    rates = {n: measure(n) for n in sorted({0, low, high})}
    best = max((low, high) if low else (high,), key=rates.__getitem__)
    # Loading in the training process does not overlap the step, workers do: it must be
    # much faster on its own to win (items that cost less than copying them between processes).
    if rates[0] > IN_PROCESS_MARGIN * rates[best]:
        best = 0
    others = ", ".join(f"{rates[n]:,.0f} with {_workers(n)}" for n in rates if n != best)
    return best, f"measured {rates[best]:,.0f} items/s, vs {others}"


def _workers(n: int) -> str:
    return f"{n} worker" + "s" * (n != 1)


def describe(p: LoaderPlan) -> str:
    parts = [_workers(p.num_workers)]
    if p.num_workers:
        parts.append(f"prefetch {p.prefetch_factor}")
    parts.append(f"pin_memory {'on' if p.pin_memory else 'off'}")
    if p.num_workers:
        kept = "on" if p.persistent_workers else "off"
        parts.append(
            f"persistent workers {kept}"
            + (" (training's)" if p.persistent_workers and not p.val_persistent_workers else "")
        )
    return ", ".join(parts)


def measures(cfg: LoaderConfig, data: DataBundle) -> bool:
    """Return whether loader=auto times loaders to choose its workers.

    Its choice is then cached."""
    return cfg.name == "auto" and cfg.num_workers < 0 and not data.in_memory


def for_run(
    cfg: LoaderConfig,
    data: DataBundle,
    batch_size: int,
    cuda: bool,
    recalled: LoaderPlan | None = None,
    source: str = "",
) -> LoaderPlan:
    """Return this rank's plan.

    With loader=auto, one line says what was chosen and why. ``recalled`` is a plan measured before,
    used untimed. ``source`` says where it came from, cached or replayed."""
    if recalled is not None:
        logger.info(f"loader=auto: {describe(recalled)} ({source}: as measured before for this data on this machine)")
        return recalled
    measure = None
    if measures(cfg, data):
        batch, make = trial(data, batch_size)
        measure = lambda workers: measure_rate(make, workers, batch, MEASURE_S / 3)  # noqa: E731
    chosen, why = decide(cfg, Host.here(cuda), data.in_memory, measure)
    if cfg.name == "auto":
        logger.info(why)
    return chosen


def trial(data: DataBundle, batch_size: int) -> tuple[int, Callable[[int], Iterable[Any]]]:
    """Return the batch size and a function from workers to a throwaway loader, for the measurement.

    The loader is the data set's own where it makes one. For a streamed set that is the loader
    kind that reads it in the run, on its own copy of the set. Otherwise it is a DataLoader over
    a fixed spread of ``train``'s items."""
    batch = max(1, min(batch_size, MEASURE_BATCH))
    if data.trial_loader is not None:
        return batch, lambda workers: data.trial_loader(batch, loader_kwargs(LoaderPlan(workers)), data.collate)  # type: ignore[misc]
    return batch, lambda workers: spread_loader(data.train, batch, workers, data.collate)


def spread_loader(
    dataset: Dataset, batch: int, workers: int, collate: Callable[[list[Any]], Any] | None = None
) -> DataLoader:
    """Return a DataLoader with ``workers`` over items spread evenly through ``dataset``.

    It has enough batches for every worker to deliver a few."""
    n = len(dataset)  # type: ignore[arg-type]
    count = min(n, batch * (2 + 4 * max(workers, 1)))
    items = Subset(dataset, [i * n // count for i in range(count)])
    kwargs = loader_kwargs(LoaderPlan(workers))
    return DataLoader(items, batch_size=batch, generator=torch.Generator(), collate_fn=collate, **kwargs)


def measure_rate(make: Callable[[int], Iterable[Any]], workers: int, batch: int, seconds: float) -> float:
    """Measure the items/s of the throwaway loader ``make(workers)`` after its first batch.

    Its batches hold ``batch`` items. Its start, forking workers or a streamed set's first chunk
    arriving, is paid once, not per item. It stops once ``seconds`` have passed since it was
    made, its start included, and a second batch has come. A pass that ends after a single
    batch, as on a tiny set, is read again. The run's random streams are left as they were."""
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()  # a custom data set may draw
    start = time.perf_counter()
    done, first = 0, None
    try:
        loader = make(workers)
        while True:
            got = 0
            for _ in loader:
                got += 1
                if first is None:
                    first = time.perf_counter()
                else:
                    done += batch
                if time.perf_counter() - start > seconds and done:
                    break
            if done or not got:
                break
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])
    return done / max(time.perf_counter() - (first or start), 1e-9)
