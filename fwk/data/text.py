"""Byte-level language-modelling data: the Python standard library's own source code.

Every machine with Python has it, so the LM recipes need no download. Files are taken in
sorted order of their path relative to the stdlib root and split into train/val by file, so
a function never straddles the split. Every ``val_every``-th file goes to val. The text is
the stdlib of the Python running fwk, and another Python version gives other bytes. So
compare losses only between runs on the same Python.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from fwk.data.base import DataBundle
from fwk.data.configs import StdlibTextConfig
from fwk.data.registry import register_data
from fwk.data.sources import EXCLUDED_DIRS, source_files, stdlib_root  # noqa: F401  (tests patch them here)
from fwk.errors import UserError

FILE_SEPARATOR = b"\n"


def split_files(files: list[Path], val_every: int) -> tuple[list[Path], list[Path]]:
    """Split the files into train and val.

    File i, counted from 0, goes to val when ``(i + 1) % val_every == 0``."""
    val = [f for i, f in enumerate(files) if (i + 1) % val_every == 0]
    train = [f for i, f in enumerate(files) if (i + 1) % val_every != 0]
    return train, val


def concat_bytes(files: list[Path], max_bytes: int = 0) -> torch.Tensor:
    """Return the files' bytes joined by FILE_SEPARATOR, cut to ``max_bytes``, as an (N,) uint8 tensor.

    ``max_bytes`` 0 means all. It stops reading once the cap is reached, so a small cap is fast.
    """
    buf = bytearray()
    for i, path in enumerate(files):
        if i:
            buf += FILE_SEPARATOR
        buf += path.read_bytes()
        if max_bytes and len(buf) >= max_bytes:
            break
    if max_bytes:
        del buf[max_bytes:]
    # clone: frombuffer shares memory with buf; own the storage instead
    return torch.frombuffer(buf, dtype=torch.uint8).clone() if buf else torch.zeros(0, dtype=torch.uint8)


class ByteWindows(Dataset):
    """Non-overlapping next-byte windows of the data.

    Item i is ``(x, y)``, with ``x = data[i*T : i*T+T]`` and ``y`` that window shifted by one. Both
    are (T,) int64, and a DataLoader stacks them to (B, T).
    """

    def __init__(self, data: torch.Tensor, seq_len: int) -> None:
        self.data = data
        self.seq_len = seq_len

    def __len__(self) -> int:
        # the last window needs one byte past its end for its target
        return max(0, (len(self.data) - 1) // self.seq_len)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} out of range [0, {len(self)})")
        start = i * self.seq_len
        chunk = self.data[start : start + self.seq_len + 1].long()  # (T + 1,)
        return chunk[:-1], chunk[1:]  # (T,), (T,)


@register_data(StdlibTextConfig)
def stdlib_text(cfg: StdlibTextConfig, *, seed: int) -> DataBundle:
    """Build the byte-level text of the standard library.

    ``seed`` is unused, since the data and split are fixed. The loader shuffles with the run's seed."""
    del seed
    if cfg.seq_len < 1:
        raise UserError(f"data.seq_len={cfg.seq_len} must be >= 1")
    if cfg.val_every < 2:
        raise UserError(f"data.val_every={cfg.val_every} must be >= 2 (1 would leave no training files)")
    root = stdlib_root()
    files = source_files(root)
    if not files:
        raise UserError(f"no .py files found in the standard library at {root}; use a Python with its stdlib sources")
    train_files, val_files = split_files(files, cfg.val_every)
    if not val_files:
        raise UserError(f"data.val_every={cfg.val_every} leaves no val file ({len(files)} files); lower it")
    train = ByteWindows(concat_bytes(train_files, cfg.max_bytes), cfg.seq_len)
    val = ByteWindows(concat_bytes(val_files, cfg.val_max_bytes), cfg.seq_len)
    for split, ds, cap in (("train", train, "max_bytes"), ("val", val, "val_max_bytes")):
        if len(ds) == 0:
            raise UserError(
                f"the {split} text has {len(ds.data)} bytes, too few for one window of seq_len={cfg.seq_len}; "
                f"raise data.{cap} or lower data.seq_len"
            )
    return DataBundle(train=train, val=val, task="lm", num_classes=256, in_memory=True, tokenizer="bytes")
