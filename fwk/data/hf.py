"""Local data read with Hugging Face datasets for ``data=hf``, with nothing downloaded.

``data.path`` is a Parquet, JSON Lines, CSV or text file, or a glob of them, or a folder
``save_to_disk`` wrote. A text file is one text. Its ``validation`` or ``test`` split is
the val set, and without one every ``val_every``-th text is. Texts are tokenized with
``data.tokenizer``. That is ``bytes``, the UTF-8 bytes with vocabulary 256, or a folder
holding a transformers tokenizer, by default the model's under ``model=hf``.

- Language modelling, without ``label_column``: the token ids of all texts are packed into
  non-overlapping windows of ``seq_len`` by ``ByteWindows``, as ``data=stdlib_text`` does.
  Each text's ids are followed by the tokenizer's end-of-text id, which is a newline for
  bytes. Items are slices of one tensor in memory, so a resumed run sees the same items in the
  same order.
- Classification, with ``label_column``: each text is truncated or padded to ``seq_len``
  tokens, and its label mapped to 0..C-1 in sorted order of the labels seen.

The tokenization is ``datasets.map``'s, cached in fwk's cache (``hf-tokens/``) by the
texts' and the tokenizer's fingerprints, so a second run reads it back.
``data.streaming=true`` reads the training texts as a stream instead (fwk/data/hf_stream.py).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import torch
from torch.utils.data import Dataset

from fwk.data.base import DataBundle
from fwk.data.configs import HFDataConfig
from fwk.data.hf_tokens import Tokenizer, joined, read
from fwk.data.registry import register_data
from fwk.data.text import ByteWindows
from fwk.errors import UserError
from fwk.track.store import cache_root

logger = logging.getLogger(__name__)


def _columns(table: Any, cfg: HFDataConfig) -> None:
    for key in ("text_column", "label_column"):
        name = getattr(cfg, key)
        if name and name not in table.column_names:
            raise UserError(
                f"data.{key}={name}: the data has no such column; its columns: {', '.join(table.column_names)}"
            )


def _ids(table: Any, tok: Tokenizer, column: str) -> Any:
    """Return each text's token ids, from a ``datasets.map`` cached in fwk's cache.

    The cache is not beside the data, which may be read-only. It is named by the texts' and the
    tokenizer's fingerprints, so that the next run with the same data and tokenizer reads it
    back."""
    key = hashlib.sha256(f"{table._fingerprint}\0{column}\0{tok.fingerprint}".encode()).hexdigest()[:16]
    folder = cache_root() / "hf-tokens"
    folder.mkdir(parents=True, exist_ok=True)
    return table.map(
        lambda batch: {"ids": tok.encode(batch[column])},
        batched=True,
        remove_columns=[c for c in table.column_names if c != column],
        new_fingerprint=key,
        cache_file_name=str(folder / f"{key}.arrow"),
    )


def _packed(table: Any, tok: Tokenizer, column: str, cap: int = 0) -> torch.Tensor:
    """Return all texts' ids, each followed by the end-of-text id, as one (N,) tensor.

    With ``cap`` set, only its first ``cap`` ids."""
    return joined(_ids(table, tok, column)["ids"], tok.end, cap)


class LabelledTexts(Dataset):
    """Texts with labels: item i is its ids (T,) int64, truncated or padded, and its int64 label."""

    def __init__(self, ids: torch.Tensor, labels: torch.Tensor) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[i], self.labels[i]


def _labelled(table: Any, tok: Tokenizer, cfg: HFDataConfig, classes: dict[Any, int]) -> LabelledTexts:
    rows = _ids(table, tok, cfg.text_column)["ids"]
    ids = torch.full((len(rows), cfg.seq_len), tok.pad, dtype=torch.long)
    for i, r in enumerate(rows):
        r = r[: cfg.seq_len]
        ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    labels = torch.as_tensor([classes[v] for v in table[cfg.label_column]], dtype=torch.long)
    return LabelledTexts(ids, labels)


@register_data(HFDataConfig)
def hf(cfg: HFDataConfig, *, seed: int) -> DataBundle:
    """Build the ``data=hf`` set, in memory or streamed.

    ``seed`` shuffles a stream (``data.streaming``, fwk/data/hf_stream.py). In memory, the data
    and split are fixed, and the loader shuffles with the run's seed."""
    cfg.check()
    if cfg.streaming:
        from fwk.data.hf_stream import bundle

        return bundle(cfg, seed)
    train, val = read(cfg)
    _columns(train, cfg)
    if val is None:
        every = cfg.val_every
        val = train.select([i for i in range(len(train)) if (i + 1) % every == 0])
        train = train.select([i for i in range(len(train)) if (i + 1) % every != 0])
        if len(val) == 0:
            raise UserError(f"data.val_every={every} leaves no val text ({len(train)} texts); lower it")
    else:
        _columns(val, cfg)
    tok = Tokenizer(cfg.tokenizer)
    if cfg.label_column:
        classes = {v: i for i, v in enumerate(sorted(set(train[cfg.label_column]) | set(val[cfg.label_column])))}
        return DataBundle(
            train=_labelled(train, tok, cfg, classes),
            val=_labelled(val, tok, cfg, classes),
            task="classification",
            num_classes=len(classes),
            in_memory=True,
            tokenizer=tok.name,
        )
    windows = {}
    for split, table, cap in (("train", train, 0), ("val", val, cfg.val_max_tokens)):
        windows[split] = ByteWindows(_packed(table, tok, cfg.text_column, cap), cfg.seq_len)
        if len(windows[split]) == 0:
            raise UserError(
                f"the {split} texts make {len(windows[split].data)} tokens, too few for one window of "
                f"seq_len={cfg.seq_len}; add text or lower data.seq_len"
            )
    logger.info(
        f"data=hf: {len(windows['train'].data):,} train and {len(windows['val'].data):,} val tokens "
        f"({tok.name}, vocabulary {tok.vocab})"
    )
    return DataBundle(
        train=windows["train"], val=windows["val"], task="lm", num_classes=tok.vocab, in_memory=True, tokenizer=tok.name
    )
