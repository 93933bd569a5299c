"""Composing the config with Hydra's compose API: conf/ groups, a recipe, the user's overrides.

This is the only place fwk calls Hydra. The launcher resolves the config once and writes
it to the run dir. Workers read that file and never compose.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from fwk.config import recipes
from fwk.config.grammar import HYDRA_GROUP, USER_GROUP, check_grammar, one_line, resources_root, to_hydra
from fwk.errors import UserError

# what a typed key expects, by OmegaConf's name of its type
_EXPECTED = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "bool": "true or false"}


def _override_error(exc: Exception) -> UserError:
    """Turn a Hydra or OmegaConf failure to compose into one line, with its cause if it has one."""
    from hydra.errors import HydraException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    from fwk.config.validate import invalid, unknown_key

    recipe = re.match(r"In 'recipes/([^']+)': ConfigKeyError", str(exc))
    key = re.search(r"full_key: (\S+)", str(exc))
    if recipe and key:  # a recipe's key that the group option picked over the recipe's does not have
        group = key.group(1).partition(".")[0]
        return UserError(
            f"recipe {recipe.group(1)} sets {key.group(1)}, which the {group} picked instead of the recipe's has no "
            f"key for; keep the recipe's {group}, or use a recipe made for this {group}"
        )
    cause = exc.__cause__
    parent = getattr(cause, "parent_node", None)
    missing = isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and parent is not None
    if missing and str(exc).startswith("Could not override"):
        # an override of a key the config does not have (train.max_stepz=3, trainr.max_steps=3)
        return unknown_key(str(cause.full_key), [str(k) for k in parent.keys() if k != "hydra"])
    typed = re.search(r"converted to (\w+)|is not a valid (\w+)", str(cause))
    value = re.match(r"Value '([^']*)'", str(cause))
    if isinstance(cause, ValidationError) and getattr(cause, "full_key", None) and typed and value:
        # a value of the wrong type (optim.lr=abc, train.max_steps=1.5, train.deterministic=maybe)
        kind = typed.group(1) or typed.group(2)
        return invalid(str(cause.full_key), value.group(1), _EXPECTED.get(kind, f"a value of type {kind}"))
    if isinstance(exc, HydraException):
        detail = f": {one_line(cause)}" if cause is not None else ""
        return UserError(f"{one_line(exc)}{detail}".replace("\n", " "))
    return UserError(f"bad override: {one_line(exc)}")


def _groups(root: Path) -> set[str]:
    """Return the names that select a config group option (``model=gpt``), as users write them."""
    return {p.name for p in (root / "conf").iterdir() if p.is_dir()} | {USER_GROUP, HYDRA_GROUP}


def _forgive(overrides: list[str], root: Path) -> list[str]:
    """Rewrite what a user means but Hydra rejects, before Hydra sees it.

    - ``+key=value`` on a key the config already has sets it, rewritten as ``++key=value``.
      Examples are ``+tags=[a,b]`` and ``+train.max_steps=5``. Hydra's ``+`` only adds a key
      that is not there yet.
    - ``parallel.nnodes=MIN:MAX``, torchrun's elastic range, sets ``parallel.min_nnodes=MIN``
      and ``parallel.nnodes=MAX``.
    - ``model._target_=pkg.Class`` without ``model=custom`` picks ``model=custom``. This holds
      for any group with a conf/<group>/custom.yaml. ``model.KEY=value`` then adds KEY, the
      class's argument. With another option, as in ``model=gpt model._target_=...``, it says
      what to write instead.
    - Under ``model=hf``, ``model.config.KEY=value`` and ``model.config={...}`` set or add the
      key, since a transformers config takes any key, whether the recipe set it or not.
    """
    overrides = [part for override in overrides for part in _elastic_range(override)]
    groups = _groups(root)
    chosen = {}
    for override in overrides:
        head, sep, value = override.partition("=")
        if sep and head.lstrip("+") in groups:
            chosen[head.lstrip("+")] = value
    custom = {group for group, option in chosen.items() if option == "custom"}
    for override in overrides:
        head, sep, _ = override.partition("=")
        group, dot, key = head.lstrip("+").partition(".")
        if not (sep and dot and key == "_target_" and group in groups):
            continue
        if not (root / "conf" / group / "custom.yaml").is_file():
            options = ", ".join(sorted(f.stem for f in (root / "conf" / group).glob("*.yaml")))
            raise UserError(f"{group} takes no _target_ (there is no {group}=custom); choose {group}=one of: {options}")
        if chosen.get(group, "custom") != "custom":
            raise UserError(
                f"{group}={chosen[group]} picks a registered {group}, which has no _target_; "
                f"for your own class write {group}=custom {group}._target_=pkg.Class"
            )
        custom.add(group)
    out = [f"{group}=custom" for group in sorted(custom) if group not in chosen]
    for override in overrides:
        head, sep, value = override.partition("=")
        key = head.lstrip("+")
        if sep and key.partition(".")[0] in custom and key.partition(".")[2]:
            out.append(f"++{key}={value}")  # custom: keys are the class's arguments, new or not
        elif sep and (key == "model.config" or key.startswith("model.config.")) and not head.startswith("~"):
            out.append(f"++{key}={value}")  # model=hf: a transformers config takes any key, new or not
        elif sep and head.startswith("+") and not head.startswith("++") and key not in groups and "/" not in key:
            out.append(f"++{key}={value}")
        else:
            out.append(override)
    return out


def _elastic_range(override: str) -> list[str]:
    """Split the elastic range ``parallel.nnodes=1:2`` into ``parallel.nnodes=2``, ``parallel.min_nnodes=1``.

    Other overrides stay as they are."""
    head, sep, value = override.partition("=")
    if not (sep and head.lstrip("+") == "parallel.nnodes" and ":" in value) or "${" in value:
        return [override]  # a count, or an interpolation (${oc.env:NNODES}) that Hydra resolves
    found = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", value)
    # a MIN of 0 would land on min_nnodes=0, which means no range: the run would wait for all MAX
    # machines, where the user asked it to start with fewer
    if not found or not 1 <= int(found[1]) <= int(found[2]):
        raise UserError(
            f"parallel.nnodes={value} is not an elastic range: expected MIN:MAX with 1 <= MIN <= MAX machines "
            "(fix it with parallel.nnodes=1:2, or parallel.nnodes=N for a fixed count)"
        )
    return [f"{head}={found[2]}", f"{head.replace('nnodes', 'min_nnodes')}={found[1]}"]


def _reject_sweeps(overrides: list[str]) -> None:
    """Refuse a sweep (``a=1,2``, ``range(...)``), which composes one config per value.

    Only ``fwk train -m`` does that."""
    from fwk.config.sweep import sweeps

    found = sweeps(overrides)
    if found:
        key, _, values = found[0].partition("=")
        as_list = "" if "(" in values else f", or write {key}=[{values}] for a list"  # a,b, not range(...)
        raise UserError(
            f"'{found[0]}' sweeps over several values; add -m to train one run per value (fwk train -m ...){as_list}"
        )


def compose(overrides: list[str]) -> dict[str, Any]:
    """Compose and resolve the config, or read it back from the cache of composed configs
    (fwk/config/compose_cache.py), which skips Hydra.

    A user's mistake raises UserError with one line."""
    from fwk.config import compose_cache

    key, cached = compose_cache.get(overrides, resources_root())
    if cached is not None:
        return cached
    composed = _compose(overrides)
    compose_cache.put(key, composed)
    return composed


def _compose(overrides: list[str]) -> dict[str, Any]:
    """Compose and resolve the config with Hydra."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from fwk.config.schema import Config

    # conf/config.yaml lists `fwk_schema` first: Hydra then type-checks every override
    # against the dataclasses and knows every key (train.max_steps=5 needs no `+`).
    store = ConfigStore.instance()
    store.store(name="fwk_schema", node=Config)
    # conf/<group>/<name>.yaml of model, data and optim start from `/schema/<group>/<name>`:
    # the registered builder's config dataclass, so its keys need no `+` and are type-checked.
    from fwk.config.validate import registries

    for group, registry in registries().items():
        for name in registry.names():
            store.store(group=f"schema/{group}", name=name, node=registry.config(name))
    root = resources_root()
    check_grammar(overrides)  # before _forgive: an error names the override as the user wrote it
    _reject_sweeps(overrides)
    hydra_overrides = [to_hydra(o) for o in _forgive(overrides, root)]
    # a recipe's sections of a group the user re-picked are left out (fwk/config/recipes.py)
    rewritten = recipes.stripped(recipes.dropped(hydra_overrides, root), root)
    search = ",".join(f"file://{p}" for p in (rewritten, root) if p is not None)
    try:
        with initialize_config_dir(config_dir=str(root / "conf"), version_base="1.3", job_name="fwk"):
            cfg = hydra_compose(
                "config",
                overrides=[*hydra_overrides, f"hydra.searchpath=[{search}]"],
                return_hydra_config=True,  # for runtime.choices: which recipe was picked
            )
    except MissingConfigException as exc:
        group, _, option = (exc.missing_cfg_file or "").rpartition("/")
        if not group:  # not a config-group option: a file Hydra could not find
            raise UserError(one_line(exc)) from None
        group = USER_GROUP if group == HYDRA_GROUP else group
        options = ", ".join(exc.options or []) or "none"
        raise UserError(
            f"unknown {group} '{option}'; choose one of: {options} (e.g. {group}={(exc.options or ['?'])[0]})"
        ) from None
    except (HydraException, OmegaConfBaseException) as exc:
        raise _override_error(exc) from None
    finally:
        if rewritten is not None:
            shutil.rmtree(rewritten, ignore_errors=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise UserError(f"cannot resolve config: {one_line(exc)}") from None
    assert isinstance(resolved, dict)
    resolved["recipe"] = choices.get(HYDRA_GROUP) or resolved.get("recipe", "")
    return resolved


def compose_group(group: str, schema: type, overrides: list[str]) -> dict[str, Any]:
    """Compose one config group on its own, for commands that do not train (`fwk export`).

    ``group=OPTION`` picks conf/<group>/OPTION.yaml, and without it ``default``.
    ``group.key=value``, ``+group.key=value`` and ``~group.key`` edit it. Keys and types come
    from ``schema``.
    """
    import dataclasses

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from fwk.config.validate import unknown_key

    keys = [f.name for f in dataclasses.fields(schema)]
    option, rest = "default", []
    for override in overrides:
        head, sep, value = override.partition("=")
        key = head.lstrip("+~")
        if sep and head == group:
            option = value
        elif key.startswith(f"{group}."):
            if key.split(".")[1] not in keys:
                raise unknown_key(f"{group}.{key.split('.')[1]}", keys)
            rest.append(override)
        else:
            raise UserError(
                f"'{override}' is not an override of the {group} group; write {group}.KEY=VALUE or {group}=OPTION"
            )
    check_grammar(rest)
    ConfigStore.instance().store(group=f"schema/{group}", name="default", node=schema)
    root = resources_root()
    try:
        with initialize_config_dir(config_dir=str(root / "conf"), version_base="1.3", job_name="fwk"):
            cfg = hydra_compose(config_name=None, overrides=[f"+{group}={option}", *rest])
    except MissingConfigException as exc:
        options = ", ".join(exc.options or []) or "none"
        raise UserError(f"unknown {group} '{option}'; choose one of: {options}") from None
    except (HydraException, OmegaConfBaseException) as exc:
        raise _override_error(exc) from None
    resolved = OmegaConf.to_container(cfg[group], resolve=True)
    assert isinstance(resolved, dict)
    return resolved
