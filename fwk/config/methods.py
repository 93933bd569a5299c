"""The ``method`` section of the config: each speed-up method's settings, ``method.NAME.*``.

``methods=[...]`` says which methods run. The section is torch-free, as the rest of the schema.

A method is one file in ``fwk/methods/``: the dataclass of its settings beside its class,
registered by ``@method`` in ``METHODS``, which imports every file of that package on first
need. The section is made from what it finds (``settings_section``), in name order. Each
method's settings check themselves. ``rules(c)`` yields ``Rule``s (holds, key, value, what
is allowed) on its own values, and, when the method runs, on what it cannot be combined
with. ``fwk/config/validate.py`` asks each one and names none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from fwk.registry import Registry

METHODS = Registry("method", package="fwk.methods")
Rule = tuple[bool, str, Any, str]  # (holds, key, value, what is allowed)
Config = Any  # fwk.config.schema.Config, the whole typed config (that module imports this one)


def settings_section() -> type:
    """Make the ``method`` section's dataclass: one field per registered method, holding its settings."""
    fields = [
        (
            name,
            METHODS.config(name),
            dataclasses.field(default_factory=METHODS.config(name), metadata={"doc": f"methods=[{name}]"}),
        )
        for name in METHODS.names()
    ]
    section = dataclasses.make_dataclass("MethodConfig", fields)
    section.__doc__ = "Each method's settings (``methods=[...]`` says which run; fwk/methods/)."
    return section


def rules(c: Config) -> Iterator[Rule]:
    """Yield every method's settings' own rules, in name order."""
    for name in METHODS.names():
        yield from getattr(c.method, name).rules(c)


def label_smoothing(config: dict[str, Any]) -> float:
    """Return the label smoothing a resolved config, as a dict, trains with.

    It is that of ``methods=[label_smoothing]``, else 0."""
    return float(config["method"]["label_smoothing"]["smoothing"]) if "label_smoothing" in config["methods"] else 0.0
