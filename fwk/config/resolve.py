"""One run's config, resolved once: composed or read back, then validated.

It is kept as the plain dict that the run id hashes and the YAML that the run dir keeps.

Every command that names a run (`fwk train`, a sweep member, `fwk replay`, `fwk profile`,
`fwk data preview`, the SLURM requeue) resolves it here, so they all hash the same dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fwk.config.schema import Config


@dataclass
class Resolved:
    """One run's config: typed as ``config``, as the plain dict that is hashed, and as the YAML written."""

    config: Config
    as_dict: dict[str, Any]
    as_yaml: str
    notes: list[str] = field(default_factory=list)  # what composing changed, said before a launch


def resolve(overrides: list[str]) -> Resolved:
    """Compose and validate the config of ``overrides``.

    A user's mistake raises UserError, in one line. A learning rate follows an accumulation the
    user changed (fwk/config/accumulation.py).
    """
    from fwk.config import accumulation
    from fwk.config.compose import compose

    composed = compose(overrides)
    scaling = accumulation.scaling(composed, overrides, compose)
    if scaling is not None:
        composed["optim"]["lr"] = scaling.scaled_lr
    resolved = from_dict(composed)
    resolved.notes = [scaling.line()] if scaling is not None else []
    return resolved


def from_dict(config_dict: dict[str, Any]) -> Resolved:
    """Validate a composed or recorded config.

    Keys added to the schema since it was recorded take their defaults."""
    import dataclasses

    from omegaconf import OmegaConf

    from fwk.config.validate import to_typed

    config = to_typed(config_dict)
    # the typed config holds plain values only (no enums, no tuples), so asdict gives what
    # OmegaConf's structured round trip gives, in a tenth of its time
    as_dict = dataclasses.asdict(config)
    return Resolved(config, as_dict, OmegaConf.to_yaml(as_dict))


def check_inputs(config: Config) -> None:
    """Run the cheap pre-flight checks, before any run dir exists.

    They check what the run reads first: that a data root exists, that a ``_target_``'s module
    is there, and the like. Then they check for settings it could never act on (``effect``)."""
    from fwk.config import effect
    from fwk.config.locate import missing_module
    from fwk.errors import UserError

    for name in ("model", "data", "optim"):
        section = getattr(config, name)
        if isinstance(section, dict):  # a `_target_` of the user's own
            missing = missing_module(str(section["_target_"]))
            if missing:
                raise UserError(
                    f"{name}._target_={section['_target_']}: there is no module '{missing}' to import here; "
                    f"install it, or add the folder that holds {missing} to PYTHONPATH"
                )
        elif hasattr(section, "check"):
            section.check()
    effect.check(config)
