"""Find modules by pattern, and wrap a module's forward without changing its state_dict.

Used by the precision strategy (``keep_fp32``, ``final_fp32``) and the memory strategy
(which blocks to checkpoint). Patterns are globs on ``named_modules()`` names
(``blocks.*.ln_1``) or type names (``LayerNorm``).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from typing import Any

from torch import nn

from fwk.errors import UserError


def match(model: nn.Module, patterns: list[str], key: str) -> dict[str, nn.Module]:
    """Modules (name -> module, in model order) matched by any pattern.

    A pattern that matches nothing is a UserError naming the closest module names.
    """
    named = [(name, m) for name, m in model.named_modules() if name]
    found: dict[str, nn.Module] = {}
    for pattern in patterns:
        hits = [(n, m) for n, m in named if fnmatch.fnmatchcase(n, pattern) or type(m).__name__ == pattern]
        if not hits:
            names = [n for n, _ in named] + sorted({type(m).__name__ for _, m in named})
            close = difflib.get_close_matches(pattern, names, n=4, cutoff=0.3) or names[:4]
            raise UserError(
                f"{key}: '{pattern}' matches no module of the model; closest: {', '.join(close)} "
                "(use names from named_modules(), globs such as 'blocks.*.ln_1', or type names such as LayerNorm)"
            )
        found.update(hits)
    return {n: m for n, m in named if n in found}


def outermost(modules: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """Drop modules nested inside another one of the set (wrapping the outer one covers them)."""
    names = sorted(modules)
    keep = {n for n in names if not any(n.startswith(o + ".") for o in names if o != n)}
    return {n: m for n, m in modules.items() if n in keep}


def wrap_forward(module: nn.Module, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``module.forward`` on this instance by ``wrapper(original_forward)``.

    The module keeps its place and parameter names, so state_dicts and checkpoints are
    unchanged. Wrappers stack: the last one installed runs first.
    """
    module.forward = wrapper(module.forward)  # type: ignore[method-assign]


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks, in order: entries of a ModuleList/Sequential whose
    entries are all of one class with submodules (ResNet bottlenecks, GPT blocks).

    A model without such a list (a small CNN) gets its top-level children that hold
    parameters instead.
    """
    found: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)) or len(m) < 2:
            continue
        kinds = {type(c) for c in m}
        if len(kinds) == 1 and any(True for _ in next(iter(m)).children()):
            if not any(name.startswith(f + ".") for f, _ in found):
                found.extend((f"{name}.{i}" if name else str(i), c) for i, c in enumerate(m))
    if found:
        return found
    return [(n, c) for n, c in model.named_children() if any(True for _ in c.parameters())]
