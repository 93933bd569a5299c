"""Reading a sharded checkpoint (``torch.distributed.checkpoint``) without running code from it.

DCP keeps a checkpoint's layout in ``.metadata``, which its ``FileSystemReader`` reads with
``pickle.load``, and its non-tensor values (an optimizer's step, a learning rate) as bytes
that its load planner reads with ``torch.load(weights_only=False)``. Either runs whatever a
crafted file names: a run directory copied from elsewhere could run code on ``fwk export``
or a resume. Here the metadata goes through an unpickler that admits only the classes DCP's
metadata is made of (``SAFE``), and the bytes through ``torch.load(weights_only=True)``. A
file that names anything else is refused in one line, before any of it is built.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from fwk.errors import UserError

_METADATA = "torch.distributed.checkpoint.metadata"
SAFE = {  # what a DCP .metadata is made of (torch 2.11 to 2.14): its own dataclasses and torch's plain values
    *(
        (_METADATA, name)
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name: torch.strided
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class Refused(pickle.UnpicklingError):
    """A checkpoint file names something that is not data."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in SAFE or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise Refused(f"{module}.{name}")


def read_metadata(path: Path) -> Metadata:
    """Return the ``.metadata`` at ``path``, built from data only; a Refused error names what it asked for."""
    with open(path, "rb") as f:
        metadata = _Unpickler(f).load()
    if not isinstance(metadata, Metadata):
        raise Refused(f"a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file reader, its ``.metadata`` read by ``read_metadata``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _load_bytes(planner: DefaultLoadPlanner, read_item: Any, value: io.BytesIO) -> None:
    """DefaultLoadPlanner.load_bytes, with ``weights_only=True``: tensors and plain values only."""
    from torch.distributed.checkpoint._traverse import set_element as set_at  # the planner's own helper

    try:
        loaded = torch.load(value, weights_only=True)
    except pickle.UnpicklingError as exc:  # "Weights only load failed ... Unsupported global: GLOBAL os.system"
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
        raise Refused(f"a pickled object ({found.group(1) if found else 'not data'})") from None
    if planner.flatten_state_dict:
        set_at(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], loaded)
    else:
        planner.state_dict[read_item.dest_index.fqn] = loaded


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, its non-tensor values read as data only."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        _load_bytes(self, read_item, value)


class _SafeWholePlanner(_EmptyStateDictLoadPlanner):
    """The planner that reads a whole checkpoint into an empty dict, its values read as data only."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        _load_bytes(self, read_item, value)


def refused(checkpoint: Path, exc: Exception) -> UserError:
    """The one line for a sharded checkpoint that asked for code."""
    return UserError(
        f"checkpoint {checkpoint} is refused: its sharded files name {exc}, which a checkpoint never holds "
        "(a crafted or foreign file); nothing of it was loaded. Move it out of the run to use the one before it"
    )


def _checked(directory: Path) -> None:
    """Read every ``.metadata`` of ``directory`` with ``read_metadata`` first: DCP turns an error in
    its reader into a message of its own, and the one line should name what was refused."""
    for path in sorted(directory.glob("*.metadata")):  # pathlib's * matches .metadata too
        try:
            read_metadata(path)
        except Refused as exc:
            raise refused(directory.parent, exc) from None


def load(shards: dict[str, Any], directory: Path) -> None:
    """``dcp.load`` of ``directory`` into ``shards``, in place, reading data only."""
    import torch.distributed.checkpoint as dcp

    _checked(directory)
    try:
        dcp.load(shards, storage_reader=SafeReader(directory), planner=SafePlanner())
    except (Exception, CheckpointException) as exc:  # DCP's own is a BaseException
        found = _refusal(exc)
        if found is None:
            raise
        raise refused(directory.parent, found) from None


def whole(directory: Path) -> dict[str, Any]:
    """Read the whole checkpoint at ``directory`` into one dict on this process, data only."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # as dcp_to_torch_save reads

    _checked(directory)
    state: dict[str, Any] = {}
    try:
        _load_state_dict(state, storage_reader=SafeReader(directory), planner=_SafeWholePlanner(), no_dist=True)
    except (Exception, CheckpointException) as exc:  # DCP's own is a BaseException
        found = _refusal(exc)
        if found is None:
            raise
        raise refused(directory.parent, found) from None
    return state


def _refusal(exc: BaseException) -> Exception | None:
    """The Refused error inside ``exc``, or None."""
    found = within(exc, lambda e: isinstance(e, Refused))
    return found if isinstance(found, Exception) else None


def within(exc: BaseException, match: Callable[[BaseException], bool]) -> BaseException | None:
    """The first error inside ``exc`` that ``match`` accepts, or None: DCP wraps each rank's
    error with its traceback, and its own errors chain others."""
    seen: list[Any] = [exc]
    while seen:
        e = seen.pop()
        if isinstance(e, tuple) and e and isinstance(e[0], BaseException):  # (exception, traceback) of a rank
            e = e[0]
        if not isinstance(e, BaseException):
            continue
        if match(e):
            return e
        seen += [c for c in (e.__cause__, e.__context__) if c is not None]
        failures = getattr(e, "failures", None)  # CheckpointException: rank -> (exception, traceback)
        if isinstance(failures, dict):
            seen += list(failures.values())
    return None
