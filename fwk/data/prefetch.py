"""Moving batches to the device: non-blocking copies from pinned memory on a side CUDA stream."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

Finish = Callable[[Any, torch.device], Any]  # DataBundle.finish: a loaded batch -> (inputs, targets) on the device


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch


def _record(batch: Any, stream: torch.cuda.Stream) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, (tuple, list)):
        for b in batch:
            _record(b, stream)
    elif isinstance(batch, dict):
        for b in batch.values():
            _record(b, stream)


class DevicePrefetcher:
    """The iterator of batches on the device, copied on a side CUDA stream.

    On the CPU it gives the batches as they come. A batch is taken from the loader only when
    the loop asks for it, so the loader's position, which a checkpoint records, is always the
    batches the loop consumed. The copy still overlaps compute. The GPU is still running the
    previous step's queued kernels when the host asks for the next batch, and the side stream
    does not wait for them. The copies are non-blocking from pinned memory
    (``loader.pin_memory``), and the compute stream waits for the copy only on the GPU, not on
    the host.
    """

    def __init__(self, batches: Iterator[Any], device: torch.device, finish: Finish | None = None) -> None:
        self.batches, self.device, self.finish = batches, device, finish
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __iter__(self) -> DevicePrefetcher:
        return self

    def _move(self, batch: Any) -> Any:
        return self.finish(batch, self.device) if self.finish is not None else _to(batch, self.device)

    def __next__(self) -> Any:
        batch = next(self.batches)
        if self.stream is None:
            # CPU: the batch as it comes (TrainStep's .to(device) is a no-op, as before)
            return self.finish(batch, self.device) if self.finish is not None else batch
        current = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            batch = self._move(batch)  # DataBundle.finish (data.decode=gpu) decodes here
        current.wait_stream(self.stream)
        _record(batch, current)  # the caching allocator must not reuse it while compute reads it
        return batch


class OnDevice:
    """A loader whose batches come through a ``DevicePrefetcher``, as evaluation's loader does."""

    def __init__(self, loader: DataLoader, device: torch.device, finish: Finish | None = None) -> None:
        self.loader, self.device, self.finish = loader, device, finish
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> DevicePrefetcher:
        return DevicePrefetcher(iter(self.loader), self.device, self.finish)
