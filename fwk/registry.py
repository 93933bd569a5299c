"""Registries that map a name to a builder and its config dataclass, keyed by the builder's function name.

A builder's config dataclass is the typed schema of its config section: every field has
a default and a one-line doc (``field(metadata={"doc": ...})``). The name in the YAML is
the name of the function in the code (timm's ``@register_model`` habit).

Composing and validating a config needs only the config dataclasses, which import no torch.
So do `fwk train --cfg`, `--dry-run` and a run that is already complete. A registry finds
its entries one of two ways:

- it names the modules: ``configs`` (torch-free, imported for any lookup) and ``builders``
  (torch, imported on the first lookup of a builder): models and data;
- it names a ``package`` and imports every module in it (each one entry, its config
  dataclass beside its class, torch imported only where it runs): methods. Adding one is
  adding its file.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def doc(default: Any, text: str, **kwargs: Any) -> Any:
    """Return a dataclass field with a default and its one-line doc."""
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
    """A named family of builders, such as models, datasets or optimizers.

    ``configs`` is the module whose import registers the config dataclasses, without torch.
    ``builders`` are the modules whose import registers the builders, with torch. Both are
    imported on first need, so that looking up a config never imports a builder.
    ``alone`` maps a name to the module of a builder whose import is heavy beyond torch
    (litdata: ~0.4 s). That module is imported only when its name is looked up.
    """

    def __init__(
        self,
        kind: str,
        configs: str | None = None,
        builders: tuple[str, ...] = (),
        alone: dict[str, str] | None = None,
        package: str | None = None,
    ) -> None:
        """Set up the registry's modules. Every module in ``package``, ``_``-prefixed ones aside,
        is imported on first need. That is how a package whose files are one entry each registers."""
        self.kind = kind
        self._configs_module = configs
        self._builder_modules = builders
        self._alone = alone or {}
        self._package = package
        self._found: list[str] | None = None  # the package's modules, listed once
        self._configs: dict[str, type] = {}
        self._builders: dict[str, Callable[..., Any]] = {}

    def register_config(self, config: type) -> type:
        """Register a config dataclass under the default of its ``name`` field, as a class decorator."""
        name = _default_name(config)
        if self._configs.get(name, config) is not config:
            raise ValueError(f"{self.kind} config {name!r} is registered twice")
        self._configs[name] = config
        return config

    def register(self, config: type, name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a builder, a function or a class, with its config dataclass, as a decorator.
        It is registered under ``name``, which defaults to the function's name."""

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            nonlocal name
            name = name or fn.__name__
            if name in self._builders:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            if self._configs.get(name, config) is not config:
                raise ValueError(f"{self.kind} {name!r}: the builder's config is not the registered config")
            self._configs[name] = config
            self._builders[name] = fn
            return fn

        return wrap

    def config(self, name: str) -> type:
        """Return the config dataclass of ``name``. It imports no builder, and so no torch."""
        self._load(builders=False)
        return self._configs[name]

    def get(self, name: str) -> Entry:
        """Return the builder and config of ``name``. The first call imports the builder modules."""
        self._load(builders=True)
        if name in self._alone:
            importlib.import_module(self._alone[name])
        return Entry(name, self._builders[name], self._configs[name])

    def names(self) -> list[str]:
        self._load(builders=False)
        return sorted(self._configs)

    def __contains__(self, name: str) -> bool:
        self._load(builders=False)
        return name in self._configs

    def _load(self, builders: bool) -> None:
        # importlib caches modules: after the first call each import is a dict lookup
        modules = [self._configs_module] if self._configs_module else []
        for module in modules + list(self._builder_modules if builders else ()) + self._package_modules():
            importlib.import_module(module)

    def _package_modules(self) -> list[str]:
        if self._package is None:
            return []
        if self._found is None:
            package = importlib.import_module(self._package)
            found = pkgutil.iter_modules(package.__path__, f"{self._package}.")
            self._found = sorted(m.name for m in found if not m.name.rpartition(".")[2].startswith("_") and not m.ispkg)
        return self._found


def _default_name(config: type) -> str:
    fields = {f.name: f for f in dataclasses.fields(config)}
    if "name" not in fields or not isinstance(fields["name"].default, str):
        raise ValueError(f"{config.__name__} needs a field `name: str` whose default is its registry name")
    return fields["name"].default
