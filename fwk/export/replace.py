"""``fwk export --output PATH --overwrite``: what it may replace, and replacing it whole.

``--overwrite`` replaces only an earlier export of the same format: a file whose name a
format's export has (``*.onnx`` for onnx, ``*.pt2`` for pt2), or, for a folder format
(``--format hf``), a folder that holds only the files such an export writes, plain files
with no folder or link among them. Anything else, a home directory, a project, a link, is
refused in one line and left as it was.

The new export is written to a temporary sibling first and renamed over the old one, so a
failure while writing leaves the earlier export untouched. A file is replaced by one
``os.replace``. A folder cannot be renamed over a folder that has files in it, so the old
one is renamed aside, the new one into its place (the old one back if that fails), and only
then is the old one removed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path

from fwk.errors import UserError

HF_FILES = (  # what save_pretrained writes for a model and its tokenizer
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.model",  # sentencepiece
    "chat_template.jinja",
    "chat_template.json",
)


def _left(output: Path, why: str) -> UserError:
    return UserError(
        f"--output {output} {why}; --overwrite replaces only an earlier export, so it is left as it is: "
        "remove it yourself or choose another path"
    )


def check_replaceable(output: Path, writes: tuple[str, ...], folder: bool) -> None:
    """Refuse, in one line, an existing ``output`` that is not an earlier export: ``writes``
    holds the name patterns of what the format writes."""
    if output.is_symlink():
        raise _left(output, "is a symbolic link")
    if not folder:
        if not any(fnmatch(output.name, w) for w in writes):
            named = " or ".join(writes) or "nothing fwk can recognize"
            raise _left(output, f"is not named as an export of this format is ({named})")
        return
    if not output.is_dir():
        raise _left(output, "is a file, and this format writes a folder")
    written = lambda p: p.is_file() and not p.is_symlink() and any(fnmatch(p.name, w) for w in writes)  # noqa: E731
    stray = sorted(p.name for p in output.iterdir() if not written(p))
    if stray:
        more = f" and {len(stray) - 1} more" if len(stray) > 1 else ""
        raise _left(output, f"holds {stray[0]}{more}, which no export of this format writes")


def replace(output: Path, write: Callable[[Path], None]) -> None:
    """Write the new export with ``write(tmp)`` into a temporary sibling of ``output``, then
    rename it over ``output`` (checked beforehand by ``check_replaceable``)."""
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    old = output.with_name(f".{output.name}.old-{os.getpid()}")
    try:
        write(tmp)
        if output.is_dir() and not output.is_symlink():
            os.rename(output, old)
            try:
                os.rename(tmp, output)
            except OSError:
                os.rename(old, output)
                raise
            shutil.rmtree(old)
        else:
            os.replace(tmp, output)
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
