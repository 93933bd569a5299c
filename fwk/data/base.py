"""The bundle that every dataset builder returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.data import Dataset

from fwk.data.registry import DATA, register_data  # noqa: F401  (their home before fwk/data/registry.py)

_MASK64 = (1 << 64) - 1


@dataclass
class DataBundle:
    """The train and validation sets, plus what the engine needs to know about the task.

    - ``task`` picks the metric: "classification" reports accuracy, and "lm" reports loss and
      perplexity per token.
    - ``num_classes`` is the number of classes, or the vocabulary size for "lm". The engine
      checks it against the model's output size.
    - Datasets whose items are random, as with augmentation, may define ``set_epoch(epoch)``.
      The engine calls it before each epoch, so that item ``i`` of epoch ``e`` is the same
      whatever the number of loader workers, and a resumed run sees the same items.
    - ``mean`` and ``std`` are what image items were normalized with, one value per channel or
      one for all. ``fwk data preview`` undoes it to show the images. None means not normalized.
    - ``in_memory`` means the items are cheap slices of tensors already in memory, or made from
      a seed in microseconds. ``loader=auto`` then loads them in the training process, as
      worker processes would only add copies. When it is False, with files to read and decode
      or nothing known, auto measures worker counts.
    - ``collate`` is the loaders' ``collate_fn``. None means PyTorch's.
    - ``finish(batch, device)`` turns a loaded batch into ``(inputs, targets)`` on the device, in
      the training process. With ``data.decode=gpu`` it decodes and augments there. None means
      the batch is ``(inputs, targets)`` already.
    - ``train_loader(batch_size, world_size, loader_kwargs, collate, rank)`` is set by a data
      set that streams, such as ``data=streaming`` and ``data=hf data.streaming=true``. It makes
      the set's own endless, resumable training loader, whose ``state_dict`` is this rank's own.
      Each rank's is kept in its own checkpoint file (fwk/components/checkpoint.py). None means
      that fwk's ``TrainLoader`` samples ``train`` by index.
    - ``trial_loader(batch_size, loader_kwargs, collate)`` makes that data set's throwaway
      loader of the same kind, over its own copy of the set. ``loader=auto`` times it for each
      worker count, leaving the run's data set and loader untouched. None means a DataLoader
      over a spread of ``train``'s items.
    - ``tokenizer`` says what text's token ids are, for an export to carry: ``bytes`` for UTF-8
      bytes, or a tokenizer folder or cache name. None means no text, or not known.
    """

    train: Dataset
    val: Dataset
    task: Literal["classification", "lm"]
    num_classes: int
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    in_memory: bool = False
    collate: Callable[[list[Any]], Any] | None = None
    finish: Callable[[Any, torch.device], Any] | None = None
    train_loader: Callable[..., Any] | None = None
    trial_loader: Callable[..., Any] | None = None
    tokenizer: str | None = None


def item_seed(seed: int, epoch: int, index: int) -> int:
    """Mix ``seed``, ``epoch`` and ``index`` into one 63-bit seed: neighbouring items get unrelated streams.

    It applies the splitmix64 finalizer in a chain. A plain ``seed + index`` would make item i
    of epoch e+1 reuse a stream of epoch e.
    """
    h = 0
    for value in (seed, epoch, index):
        h = ((h ^ (value & _MASK64)) + 0x9E3779B97F4A7C15) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h >> 1  # torch.manual_seed takes any int, but keep it positive and < 2**63
