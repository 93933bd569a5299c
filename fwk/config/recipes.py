"""The rule that a recipe's settings of a group whose option the user changes are not applied.

A recipe tunes the options it picks: resnet_digits sets ``optim.lr=0.05`` and
``optim.momentum=0.9`` for its ``sgd``. With ``optim=adamw`` on the command line those
settings belong to an optimizer that is not there. Momentum is no AdamW key, so Hydra would
refuse to compose, and an SGD learning rate would make AdamW diverge. So a recipe's section
of a group is applied only while the group's option is the one the recipe, or the recipe it
extends, picked. Otherwise the new option's own defaults hold, and the launch says which
settings were left out. Keys given on the command line always apply. Only ``optim`` works
this way. A recipe's model and data settings (``num_classes``, ``image_size``) describe its
data, and hold for any option that has the key.

``compose`` reads the recipes through ``stripped``: a folder of rewritten copies of the
recipes concerned, put before the originals in Hydra's search path.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.config.grammar import HYDRA_GROUP, USER_GROUP

PACKAGE_HEADER = "# @package _global_\n"
TUNED = ("optim",)  # groups whose settings are tuned to the option: model and data keep theirs (num_classes, ...)


@dataclass(frozen=True)
class Dropped:
    recipe: str
    group: str
    recipes_option: str
    chosen: str
    settings: dict[str, Any]
    by_user: bool  # the command line picked the option (else a recipe extending this one did: said nowhere)

    def line(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        return (
            f"{self.group}={self.chosen}: recipe {self.recipe}'s {self.group} settings ({shown}) are for its "
            f"{self.recipes_option} and are not applied; {self.chosen}'s defaults hold (set {self.group}.KEY=... "
            "to tune)"
        )


def _read(path: Path) -> dict[str, Any]:
    import yaml

    loaded = yaml.safe_load(path.read_text()) if path.is_file() else None
    return loaded if isinstance(loaded, dict) else {}


def _picks(defaults: list[Any]) -> tuple[dict[str, str], list[str]]:
    """Return group -> option for what a defaults list overrides, and the recipes it extends."""
    picks, parents = {}, []
    for entry in defaults or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                group = str(key).removeprefix("override ").strip().lstrip("/")
                picks[group] = str(value)
        elif isinstance(entry, str) and entry != "_self_":
            parents.append(entry)
    return picks, parents


def _root_choice(root: Path) -> tuple[dict[str, str], str]:
    """Return conf/config.yaml's option of each group, and its recipe."""
    picks, _ = _picks(_read(root / "conf" / "config.yaml").get("defaults", []))
    return picks, picks.pop(HYDRA_GROUP, "")


def _chosen(overrides: list[str]) -> dict[str, str]:
    """Return the ``group=option`` picks on the command line, ``recipe=`` included, as Hydra names it."""
    out = {}
    for override in overrides:
        head, sep, value = override.partition("=")
        head = head.lstrip("+")
        if sep and (head in TUNED or head in (USER_GROUP, HYDRA_GROUP)):
            out[HYDRA_GROUP if head == USER_GROUP else head] = value
    return out


def dropped(overrides: list[str], root: Path) -> list[Dropped]:
    """Return the recipe sections left out.

    A section is left out for each recipe of the chain whose option of a tuned group is not the
    one in use. The one in use is the command line's, else the last the chain picks."""
    defaults, recipe = _root_choice(root)
    chosen = _chosen(overrides)
    recipe = chosen.pop(HYDRA_GROUP, recipe)
    chain: list[tuple[str, dict[str, Any], dict[str, str]]] = []  # (recipe, its file, its options), parents first

    def walk(name: str, seen: tuple[str, ...]) -> dict[str, str]:
        doc = _read(root / "recipes" / f"{name}.yaml")
        picks, parents = _picks(doc.get("defaults", []))
        inherited: dict[str, str] = {}
        for parent in parents:
            if parent not in seen:
                inherited.update(walk(parent, (*seen, parent)))
        options = {**defaults, **inherited, **picks}
        chain.append((name, doc, options))
        return options

    final = walk(recipe, (recipe,)) if recipe else dict(defaults)
    out = []
    for group in TUNED:
        in_use = chosen.get(group, final.get(group, ""))
        for name, doc, options in chain:
            section = doc.get(group)
            if isinstance(section, dict) and section and options.get(group) != in_use:
                out.append(Dropped(name, group, options.get(group, "?"), in_use, section, group in chosen))
    return out


def stripped(found: list[Dropped], root: Path) -> Path | None:
    """Write a folder with ``recipes/NAME.yaml`` copies that leave the dropped sections out, and return it."""
    if not found:
        return None
    import yaml

    folder = Path(tempfile.mkdtemp(prefix="fwk-recipes-"))
    (folder / "recipes").mkdir()
    for name in {d.recipe for d in found}:
        doc = _read(root / "recipes" / f"{name}.yaml")
        for d in found:
            if d.recipe == name:
                doc.pop(d.group, None)
        (folder / "recipes" / f"{name}.yaml").write_text(PACKAGE_HEADER + yaml.safe_dump(doc, sort_keys=False))
    return folder
