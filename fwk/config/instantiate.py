"""Building the user's own class from a config section's ``_target_``, with a failure in one line.

Hydra's ``instantiate`` does the building. These functions turn what goes wrong into a
``UserError`` that names the target, and leave out the keys a recipe set for its own model
that the user's class does not take.
"""

from __future__ import annotations

from typing import Any

from fwk.config.locate import import_from_working_folder
from fwk.errors import UserError


def instantiate(section: dict[str, Any], **kwargs: Any) -> Any:
    """Build ``section``'s ``_target_`` with its keys and ``kwargs``.

    A failure to import or construct it is one line naming the target and the cause."""
    from hydra.utils import instantiate as build

    try:
        import_from_working_folder(section["_target_"])
        return build(section, **kwargs)
    except Exception as exc:  # the user's class failed to import or construct
        cause = exc.__cause__ or exc
        raise UserError(f"cannot build {section['_target_']}: {type(cause).__name__}: {cause}") from None


def model_arguments(section: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Return a ``_target_`` model section without the keys its class does not take, and those keys.

    A recipe sets keys for its own model, such as ``model.num_classes`` and ``model.n_layer``.
    With the user's ``model._target_`` they reach the user's class too. Those it does not take
    are left out, so a recipe works with any model. A key the user typed is checked in
    ``preflight``.
    """
    import inspect

    from hydra.utils import get_object

    section = {k: v for k, v in section.items() if k != "init_from"}  # fwk's: loaded by build_model
    target = section["_target_"]
    try:
        import_from_working_folder(target)
        signature = inspect.signature(get_object(target))
    except Exception:  # noqa: BLE001 - not importable or no signature: instantiate says what is wrong
        return section, []
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return section, []
    takes = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    dropped = [k for k in section if not k.startswith("_") and k not in takes]
    return {k: v for k, v in section.items() if k not in dropped}, dropped
