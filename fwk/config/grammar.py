"""The command line's override grammar, shared by composing one config and expanding a sweep.

``compose.py`` composes one config and ``sweep.py`` expands a sweep. The grammar says where
conf/ and recipes/ live, and reads ``recipe=`` as users write it. It runs Hydra's parser on
each override alone, so that an error names the one."""

from __future__ import annotations

from pathlib import Path

from fwk.errors import UserError

# `recipe=NAME` on the command line selects recipes/NAME.yaml. Hydra names a config group
# after its folder, so the group is called "recipes"; users only ever see "recipe".
USER_GROUP, HYDRA_GROUP = "recipe", "recipes"


def resources_root() -> Path:
    """Return the folder holding conf/ and recipes/: bundled in a wheel, else the source tree."""
    package = Path(__file__).resolve().parents[1]
    bundled = package / "_resources"
    return bundled if (bundled / "conf").is_dir() else package.parent


def recipe_names() -> list[str]:
    return sorted(p.stem for p in (resources_root() / "recipes").glob("*.yaml"))


TARGET_KEYS = ("train.stop_at",)  # values such as val_acc>=0.985, which Hydra's grammar reads only quoted


def to_hydra(override: str) -> str:
    """Rewrite `recipe=X` and `+recipe=X` to the Hydra group name, and quote a target.

    A target such as `train.stop_at=val_acc>=0.985` needs quotes, since Hydra's grammar has no
    unquoted `>` or `<`."""
    head, sep, value = override.partition("=")
    if sep and head.lstrip("+~") == USER_GROUP:
        return head.replace(USER_GROUP, HYDRA_GROUP) + sep + value
    if sep and head.lstrip("+") in TARGET_KEYS and value[:1] not in ("'", '"') and ("<" in value or ">" in value):
        return f"{head}='{value}'"
    return override


def one_line(exc: Exception) -> str:
    return " ".join(str(exc).split("\n")[0].split())


def check_grammar(overrides: list[str]) -> None:
    """Parse each override alone, so an error names the one that is wrong."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(to_hydra(override))
        except HydraException as exc:  # the parser raises it bare, not as OverrideParseException
            reason = one_line(exc)
            raise UserError(
                f"cannot parse override '{override}': {reason}; write key=value, group=option, +key=value or ~key"
            ) from None


def typed_keys(overrides: list[str]) -> set[str]:
    """Return the config keys and groups an override list sets by name.

    ``precision.keep_fp32=[fc]`` gives ``precision.keep_fp32``, and ``optim=muon`` gives
    ``optim``. ``+a.b=1`` and ``~a.b`` count too. They are what the user chose, as against what
    the recipe and the groups' defaults gave."""
    return {head.lstrip("+~") for head, _, _ in (o.partition("=") for o in overrides)}
