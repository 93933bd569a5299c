"""How ``data=hf`` reads and tokenizes, in memory or streamed.

fwk/data/hf.py keeps the data in memory, and fwk/data/hf_stream.py streams it. Both read the
data's files through Hugging Face datasets. The tokenizer is UTF-8 bytes, or a transformers
tokenizer from a local folder."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fwk.data.configs import HF_FORMATS, HFDataConfig
from fwk.errors import UserError

VAL_SPLITS = ("validation", "valid", "val", "test")


def datasets_lib() -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError("data=hf needs Hugging Face datasets: pip install 'fwk[hf]'") from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def read(cfg: HFDataConfig, streaming: bool = False) -> tuple[Any, Any | None]:
    """Return the training texts, and the data's own validation split or None.

    They are datasets' tables, or with ``streaming`` their streams. A stream reads files as they
    are iterated. A ``save_to_disk`` folder is memory-mapped and iterated through
    ``to_iterable_dataset``."""
    ds = datasets_lib()
    where = Path(cfg.path).expanduser()
    try:
        if where.is_dir():
            loaded = ds.load_from_disk(str(where))
        else:
            files = [str(f) for f in cfg.files()]
            kind = HF_FORMATS[Path(files[0]).suffix]
            extra = {"sample_by": "document"} if kind == "text" else {}
            loaded = ds.load_dataset(kind, data_files=files, streaming=streaming, **extra)
    except (OSError, ValueError, FileNotFoundError) as exc:
        raise UserError(f"data.path={cfg.path}: cannot read it with datasets: {str(exc).splitlines()[0]}") from None
    if isinstance(loaded, (ds.DatasetDict, ds.IterableDatasetDict)):
        val = next((loaded[s] for s in VAL_SPLITS if s in loaded), None)
        train = loaded["train"] if "train" in loaded else loaded[next(s for s in loaded if s not in VAL_SPLITS)]
    else:
        train, val = loaded, None
    if streaming and where.is_dir():
        train, val = train.to_iterable_dataset(), (val.to_iterable_dataset() if val is not None else None)
    return train, val


class Tokenizer:
    """The tokenizer from texts to token ids: UTF-8 bytes, or a transformers tokenizer from a local folder."""

    def __init__(self, where: str | None) -> None:
        self.name = where or "bytes"
        self.fingerprint = "bytes"  # what its ids depend on: bytes, or its folder's tokenizer files
        if self.name == "bytes":
            self.hf, self.vocab, self.end, self.pad = None, 256, [ord("\n")], 0
            return
        from fwk.models.hf import folder, transformers

        # under model=hf, data.tokenizer defaults to model.path, whose folder may hold no tokenizer
        bytes_instead = "set data.tokenizer=bytes (UTF-8 bytes, vocabulary 256: no tokenizer files)"
        where = folder(self.name, "tokenizer_config.json", "data.tokenizer", bytes_instead)
        self.fingerprint = _files_hash(Path(where))
        try:
            self.hf = transformers().AutoTokenizer.from_pretrained(where, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise UserError(
                f"data.tokenizer={self.name}: no tokenizer there ({str(exc).splitlines()[0]}); "
                "give a folder with tokenizer files, or data.tokenizer=bytes"
            ) from None
        self.vocab = len(self.hf)
        self.end = [self.hf.eos_token_id] if self.hf.eos_token_id is not None else []
        self.pad = self.hf.pad_token_id if self.hf.pad_token_id is not None else (self.hf.eos_token_id or 0)

    def encode(self, texts: list[str]) -> list[list[int]]:
        if self.hf is None:
            return [list(t.encode("utf-8")) for t in texts]
        return self.hf(texts, add_special_tokens=False)["input_ids"]


def byte_tokenizer() -> Any:
    """Build ``data.tokenizer=bytes`` as a transformers tokenizer.

    Each text's UTF-8 bytes are its ids, and ids decode back to the text. It is a byte-level BPE
    of no merges over GPT-2's byte alphabet. The hf export of a byte-level run carries it, so
    that ``AutoTokenizer`` loads it. It adds no end-of-text id, since fwk's byte-level data ends
    a text with a newline."""
    from tokenizers import Tokenizer as Fast
    from tokenizers import decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from fwk.models.hf import transformers

    char = bytes_to_unicode()  # byte -> the printable character that stands for it
    fast = Fast(models.BPE(vocab={char[b]: b for b in range(256)}, merges=[]))
    fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    fast.decoder = decoders.ByteLevel()
    return transformers().PreTrainedTokenizerFast(tokenizer_object=fast)


TOKENIZER_FILES = ("tokenizer*", "vocab*", "merges*", "special_tokens_map.json", "added_tokens.json", "*.tiktoken")


def _files_hash(folder: Path) -> str:
    """Hash a folder's tokenizer files, not its weights."""
    digest = hashlib.sha256()
    for path in sorted({p for pattern in TOKENIZER_FILES for p in folder.glob(pattern) if p.is_file()}):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def joined(ids: Iterable[list[int]], end: list[int], cap: int = 0) -> torch.Tensor:
    """Join texts' ids, each followed by ``end``, into one (N,) int32 tensor of the first ``cap`` ids.

    ``cap`` 0 means all. ``ids`` is read no further than ``cap`` needs."""
    parts, total = [], 0
    for one in ids:
        parts.append(np.asarray(one + end, dtype=np.int32))
        total += len(parts[-1])
        if cap and total >= cap:
            break
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return torch.from_numpy(flat[:cap] if cap else flat)
