"""Find modules by pattern, and wrap a module's forward without changing its state_dict.

The precision strategy uses it for ``keep_fp32`` and ``final_fp32``, and the memory strategy
to pick which blocks to checkpoint. Patterns are globs on ``named_modules()`` names
(``blocks.*.ln_1``) or on type names, such as ``LayerNorm``, or ``*Norm`` for every norm of a
Hugging Face model, LlamaRMSNorm and LayerNorm alike. A pattern may also name a type's first or
last module (``last:Linear``).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from typing import Any

from torch import nn

from fwk.errors import UserError


def _hits(named: list[tuple[str, nn.Module]], pattern: str) -> list[tuple[str, nn.Module]]:
    """Return the modules one pattern names. ``last:TYPE`` / ``first:TYPE`` is the last / first
    module of that type in model order: ``last:Linear`` is a classifier or LM head, whatever
    its name. Any other pattern is a glob on the module's name, or on its type's name."""
    place, sep, kind = pattern.partition(":")
    if sep and place in ("first", "last"):
        of_type = [(n, m) for n, m in named if type(m).__name__ == kind]
        return of_type[-1:] if place == "last" else of_type[:1]
    return [
        (n, m) for n, m in named if fnmatch.fnmatchcase(n, pattern) or fnmatch.fnmatchcase(type(m).__name__, pattern)
    ]


def _named(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if name]


def match(model: nn.Module, patterns: list[str], key: str) -> dict[str, nn.Module]:
    """Return the modules that any pattern matches, as name -> module in model order.

    A pattern that matches nothing is a UserError naming the closest module names: use
    ``fitting`` first for patterns that are defaults rather than the user's own.
    """
    named = _named(model)
    found: dict[str, nn.Module] = {}
    for pattern in patterns:
        hits = _hits(named, pattern)
        if not hits:
            names = [n for n, _ in named] + sorted({type(m).__name__ for _, m in named})
            close = difflib.get_close_matches(pattern, names, n=4, cutoff=0.3) or names[:4]
            raise UserError(
                f"{key}: '{pattern}' matches no module of the model; closest: {', '.join(close)} "
                "(use names from named_modules(), globs such as 'blocks.*.ln_1', type names such as LayerNorm "
                "or *Norm, or last:TYPE / first:TYPE such as last:Linear)"
            )
        found.update(hits)
    return {n: m for n, m in named if n in found}


def fitting(model: nn.Module, patterns: list[str], key: str) -> tuple[list[str], str | None]:
    """Return the patterns that match a module of ``model``, and the one line on those left out, if any.

    For a recipe's defaults (``keep_fp32: [last:Linear]``): they apply where they match, so a
    recipe works with the user's own model. A pattern the user typed is checked strictly
    before the launch (``fwk.strategies.preflight``), so one that is left here was not typed.
    """
    named = _named(model)
    kept = [p for p in patterns if _hits(named, p)]
    dropped = [p for p in patterns if p not in kept]
    if not dropped:
        return kept, None
    quoted = ", ".join(f"'{p}'" for p in dropped)
    return kept, (
        f"{key}: {quoted} (the recipe's default) matches no module of {type(model).__name__}: left out "
        f"(set {key}=[...] to choose modules of this model)"
    )


def outermost(modules: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """Drop modules nested inside another one of the set, since wrapping the outer one covers them."""
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
    """Return the model's repeated blocks, in order: entries of a ModuleList/Sequential whose
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


def last_linear(model: nn.Module) -> list[str]:
    """Return the name of the model's last ``nn.Linear``, mostly its head, or none."""
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return linears[-1:]
