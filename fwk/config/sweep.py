"""The expansion of a multirun command line into one override list per run.

A multirun command line is one such as `fwk train -m a=1,2 b=x,y`. Hydra's own grammar
decides what sweeps: ``a,b``, ``choice(...)``, ``range(...)`` and ``glob(...)`` over a config
group's options. The product follows ``split_arguments`` of Hydra's BasicSweeper, in
hydra/_internal/core_plugins/basic_sweeper.py. It makes one list of choices per key, in the
order the keys were first given. A key given twice keeps its first place and its last value.
Then ``itertools.product`` runs, so the last key varies fastest. Unlike BasicSweeper, an
override that does not sweep is passed on exactly as typed. BasicSweeper re-renders it, which
turns ``~key`` into ``~key=null``. It imports no torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from fwk.config.grammar import HYDRA_GROUP, USER_GROUP, check_grammar, one_line, resources_root, to_hydra
from fwk.errors import UserError


@dataclass(frozen=True)
class Combination:
    """One run of a sweep: its whole override list, and the value it takes for each swept key."""

    overrides: tuple[str, ...]
    values: tuple[tuple[str, str], ...]  # (swept key, value), in the order of the swept keys

    def label(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.values) or "(no swept key)"


def _user_key(key: str) -> str:
    """Turn Hydra's group name back into what users write: `recipes` becomes `recipe`."""
    return key.replace(HYDRA_GROUP, USER_GROUP) if key.lstrip("+~") == HYDRA_GROUP else key


def _parser() -> Any:
    """Return Hydra's override parser, with a config loader so that ``glob(...)`` lists a group's options."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.override_parser.overrides_parser import OverridesParser

    root = resources_root()
    search_path = create_config_search_path(str(root / "conf"))
    search_path.append("fwk", f"file://{root}")  # recipes/ is the `recipes` group, as in compose()
    return OverridesParser.create(config_loader=ConfigLoaderImpl(config_search_path=search_path))


def _choices(override: Any, typed: str) -> list[str]:
    """Return the overrides one key contributes to the product: its sweep's values, or itself."""
    if not override.is_sweep_override():
        return [typed]
    if not override.is_discrete_sweep():
        raise UserError(f"'{typed}' is an interval, which cannot be listed; write a,b,c or range(...)")
    from hydra.errors import HydraException

    try:
        values = list(override.sweep_string_iterator())
    except HydraException as exc:
        raise UserError(f"cannot expand '{typed}': {one_line(exc)}") from None
    if not values:
        raise UserError(f"'{typed}' sweeps over no values; check the glob or range")
    key = _user_key(override.get_key_element())
    return [f"{key}={value}" for value in values]


def sweeps(overrides: list[str]) -> list[str]:
    """Return the overrides, as typed, that sweep over several values."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    return [o for o in overrides if parser.parse_override(to_hydra(o)).is_sweep_override()]


def expand(overrides: list[str]) -> tuple[list[str], list[Combination]]:
    """Return the swept keys and every combination, in order.

    A key with one value is not "swept"."""
    check_grammar(overrides)  # a parse error names the override as the user wrote it
    parsed = _parser().parse_overrides([to_hydra(o) for o in overrides])
    per_key: dict[str, list[str]] = {}
    for override, typed in zip(parsed, overrides, strict=True):
        key = _user_key(override.get_key_element())
        per_key[key] = _choices(override, typed)
    swept = [key for key, choices in per_key.items() if len(choices) > 1]
    combinations = []
    for chosen in itertools.product(*per_key.values()):
        values = tuple(
            (key.lstrip("+"), o.partition("=")[2]) for key, o in zip(per_key, chosen, strict=True) if key in swept
        )
        combinations.append(Combination(tuple(chosen), values))
    return [key.lstrip("+") for key in swept], combinations  # `+model.at` sweeps the key model.at
