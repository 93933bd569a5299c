"""What ``data=hf`` reads and tokenizes with, in memory (fwk/data/hf.py) or streamed
(fwk/data/hf_stream.py): Hugging Face datasets, and a tokenizer (UTF-8 bytes, or a
transformers tokenizer from a local folder)."""

from __future__ import annotations

from typing import Any

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


class Tokenizer:
    """Texts -> token ids: UTF-8 bytes, or a transformers tokenizer from a local folder."""

    def __init__(self, where: str | None) -> None:
        self.name = where or "bytes"
        if self.name == "bytes":
            self.hf, self.vocab, self.end, self.pad = None, 256, [ord("\n")], 0
            return
        from fwk.models.hf import folder, transformers

        where = folder(self.name, "tokenizer_config.json", "data.tokenizer")
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
    """``data.tokenizer=bytes`` as a transformers tokenizer: each text's UTF-8 bytes are its
    ids, and ids decode back to the text (a byte-level BPE of no merges over GPT-2's byte
    alphabet). What the hf export of a byte-level run carries, so that ``AutoTokenizer`` loads
    it; it adds no end-of-text id (fwk's byte-level data ends a text with a newline)."""
    from tokenizers import Tokenizer as Fast
    from tokenizers import decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from fwk.models.hf import transformers

    char = bytes_to_unicode()  # byte -> the printable character that stands for it
    fast = Fast(models.BPE(vocab={char[b]: b for b in range(256)}, merges=[]))
    fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    fast.decoder = decoders.ByteLevel()
    return transformers().PreTrainedTokenizerFast(tokenizer_object=fast)
