"""The dataset registry: ``data.name`` in the config is a function name here.

Importing this package imports no torch. The builders are imported by ``DATA`` on the first
builder lookup, and ``DataBundle``, a torch type, on first access.
"""

from typing import Any

from fwk.data.registry import DATA, register_data

__all__ = ["DATA", "DataBundle", "register_data"]


def __getattr__(name: str) -> Any:
    if name == "DataBundle":
        from fwk.data.base import DataBundle

        return DataBundle
    raise AttributeError(f"module 'fwk.data' has no attribute {name!r}")
