"""What a recorded config may build: a run directory's ``config.yaml`` is data from wherever the
directory came from, and ``fwk export`` and ``fwk replay`` build from it.

A section's own ``_target_`` (``model._target_: my_models.Net``) is the class the user trained,
and is built as at training. Hydra's ``instantiate`` would also build every ``_target_`` nested
inside it, any callable at all (``torch.load`` of a pickle runs the pickle's code), and
``trust_remote_code: true`` makes transformers run a model folder's Python. A recorded config
holding either is refused in one line unless the user says, on the command line, that they
wrote it (``--trust-config``). A section's own ``_target_`` that names the standard library or
a function of torch (``torch.load``, ``os.system``), which no model or data set is, is refused
the same way; a section's class of the user's own is trusted as the code they trained with.
This module imports nothing heavy: it reads the config as the dict it is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from fwk.errors import UserError

# packages whose callables a recorded config never names as a model or data set: what they
# build is a file read, a process, an unpickling, not a model
_NOT_MODELS = {"builtins", "torch", "numpy", "pickle", "dill", "joblib", "hydra", "omegaconf"}


def _nested(node: Any, where: str, depth: int) -> Iterator[tuple[str, str]]:
    """Yield (dotted key, what it asks) for each nested ``_target_`` and each ``trust_remote_code: true``."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key == "_target_" and depth > 1:
                yield path, f"a nested _target_ ({value})"
            elif key == "trust_remote_code" and value is True:
                yield path, "trust_remote_code=true (it runs the model folder's own Python)"
            else:
                yield from _nested(value, path, depth + 1)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _nested(value, f"{where}[{i}]", depth + 1)


def _top_targets(config: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """A section's own ``_target_`` in the standard library, or a function of torch, numpy and the
    unpicklers (``torch.load``; their classes, ``torch.optim.SGD``, are named in capitals)."""
    for name, section in config.items():
        target = section.get("_target_") if isinstance(section, dict) else None
        if isinstance(target, str):
            package, leaf = target.split(".", 1)[0], target.rsplit(".", 1)[-1]
            if package in sys.stdlib_module_names or (package in _NOT_MODELS and not leaf[:1].isupper()):
                yield f"{name}._target_", f"{target}, which is no model, data set or optimizer of the user's own"


def asks(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Return (key, what) for everything in ``config`` that would build or run more than its sections' own classes."""
    return [*_nested(config, "", 0), *_top_targets(config)]


_trusted = [False]  # --trust-config on this command's line (fwk export, fwk replay)


def trust(yes: bool) -> None:
    """Record whether this command's line said ``--trust-config``."""
    _trusted[0] = bool(yes)


def check_recorded(config: dict[str, Any], where: str) -> None:
    """Refuse, in one line, a recorded config (read from ``where``) that asks for code, unless the
    command line said ``--trust-config``."""
    found = asks(config)
    if found and not _trusted[0]:
        key, what = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UserError(
            f"{where}: {key} is {what}{more}, which fwk does not build from a recorded config, since a run "
            "directory may come from anyone; pass --trust-config if you wrote this config"
        )
