"""Name -> (builder, config dataclass) registries, keyed by the builder's function name.

A builder's config dataclass is the typed schema of its config section: every field has
a default and a one-line doc (``field(metadata={"doc": ...})``). The name in the YAML is
the name of the function in the code (timm's ``@register_model`` habit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def doc(default: Any, text: str, **kwargs: Any) -> Any:
    """A dataclass field with a default and its one-line doc."""
    if isinstance(default, (list, dict)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata={"doc": text}, **kwargs)
    return dataclasses.field(default=default, metadata={"doc": text}, **kwargs)


@dataclass(frozen=True)
class Entry:
    name: str
    builder: Callable[..., Any]
    config: type


class Registry:
    """A named family of builders (models, datasets, optimizers)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, config: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            if fn.__name__ in self._entries:
                raise ValueError(f"{self.kind} {fn.__name__!r} is registered twice")
            self._entries[fn.__name__] = Entry(fn.__name__, fn, config)
            return fn

        return wrap

    def get(self, name: str) -> Entry:
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries
