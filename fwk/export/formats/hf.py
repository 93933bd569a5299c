"""``--format hf``: write a ``model=hf`` run as the folder ``save_pretrained`` writes, reloaded
with ``AutoModelFor*``.

The folder holds ``config.json``, ``generation_config.json`` for a generative model,
``model.safetensors``, sharded above ``SHARD``, and the tokenizer the run trained with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.errors import UserError
from fwk.export.formats import FORMATS, Format

SHARD = "2GB"  # larger models are written as several model-0000N-of-0000M.safetensors


def _tokenizer(source: Any) -> Any:
    """Return the tokenizer the run trained with: the data's (bytes, or a folder), else model.path's."""
    from fwk.models.hf import folder, transformers

    named, path = source.data.tokenizer, source.data.tokenizer or source.config.model.path
    if named == "bytes":
        from fwk.data.hf_tokens import byte_tokenizer

        return byte_tokenizer()
    if not path:
        return None
    try:
        return transformers().AutoTokenizer.from_pretrained(
            folder(path, "tokenizer_config.json"), local_files_only=True
        )
    except (UserError, OSError, ValueError, TypeError):  # no tokenizer there (a config and weights alone)
        return None


@dataclass(frozen=True)
class HF(Format):
    name: str = "hf"
    folder: bool = True
    how: str = "AutoModel.from_pretrained"

    def writes(self) -> tuple[str, ...]:
        from fwk.export.replace import HF_FILES

        return HF_FILES

    def write(self, source: Any, out: Path, log: Path) -> tuple[Any, list[str]]:
        from fwk.models.hf import AUTO, HFModel, transformers

        model = source.model
        if not isinstance(model, HFModel):
            raise UserError(
                f"--format hf writes model=hf runs; run {source.run.id}'s model is {source.config.model.name}: "
                "use --format safetensors for its raw weights, or --format onnx"
            )
        model.hf.save_pretrained(out, max_shard_size=SHARD)
        tokenizer = _tokenizer(source)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        auto = getattr(transformers(), AUTO[model.task])
        reloaded = HFModel(auto.from_pretrained(out, local_files_only=True, dtype=model.hf.dtype), model.task).eval()
        return reloaded, sorted(p.name for p in out.iterdir())


FORMATS.register(HF, name="hf")(HF)
