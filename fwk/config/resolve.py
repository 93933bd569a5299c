"""One run's config, resolved once: composed (or read back), validated, and as the plain
dict that the run id hashes and the YAML that the run dir keeps.

Every command that names a run (`fwk train`, a sweep member, `fwk replay`, `fwk profile`,
`fwk data preview`, the SLURM requeue) resolves it here, so they all hash the same dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fwk.config.schema import Config


@dataclass
class Resolved:
    """One run's config: typed (``config``), as a plain dict (hashed), as YAML (written)."""

    config: Config
    as_dict: dict[str, Any]
    as_yaml: str


def resolve(overrides: list[str]) -> Resolved:
    """Compose and validate the config of ``overrides`` (a user's mistake: UserError, one line)."""
    from fwk.config.compose import compose

    return from_dict(compose(overrides))


def from_dict(config_dict: dict[str, Any]) -> Resolved:
    """Validate a composed or recorded config; keys added to the schema since take their defaults."""
    from omegaconf import OmegaConf

    from fwk.config.validate import to_typed

    config = to_typed(config_dict)
    as_dict = OmegaConf.to_container(OmegaConf.structured(config), resolve=True)
    assert isinstance(as_dict, dict)
    return Resolved(config, as_dict, OmegaConf.to_yaml(as_dict))


def check_inputs(config: Config) -> None:
    """Cheap pre-flight checks of what the run reads (a data root exists, ...), before any run dir."""
    for section in (config.model, config.data, config.optim):
        if hasattr(section, "check"):
            section.check()
