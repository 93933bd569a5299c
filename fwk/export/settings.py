"""The ``export`` config group, composed on its own with Hydra's grammar, typed and range-checked."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fwk.config.export_schema import QUANTIZATIONS, ExportConfig
from fwk.config.schema import SWITCHES
from fwk.errors import UserError

METHODS = ("none", "magnitude", "taylor", "lottery_ticket")


@dataclass(frozen=True)
class PrunePlan:
    """What ``--prune``, ``--ratio`` and ``--rounds`` ask for."""

    method: str = "none"
    ratio: float = 0.5
    rounds: int = 1

    @classmethod
    def checked(cls, method: str, ratio: float, rounds: int | None) -> PrunePlan:
        """Check the user's choices before any work, one line per mistake. Lottery tickets
        default to 3 rounds."""
        if method not in METHODS:
            raise UserError(f"--prune={method} is not allowed: expected one of {', '.join(METHODS)}")
        if not 0.0 < ratio < 1.0:
            raise UserError(f"--ratio={ratio:g} is not allowed: expected a share of channels to remove, in (0, 1)")
        if rounds is not None and rounds < 1:
            raise UserError(f"--rounds={rounds} is not allowed: expected an integer >= 1")
        if method == "none":
            return cls()
        return cls(method, ratio, rounds or (3 if method == "lottery_ticket" else 1))


def check_quantize(method: str) -> str:
    if method not in QUANTIZATIONS:
        raise UserError(
            f"--quantize={method} is not allowed: expected one of {', '.join(QUANTIZATIONS)} "
            "(int8: static, calibrated, for conv nets; dynamic_int8: for transformers)"
        )
    return method


def check_qat_steps(value: str, quantize: str) -> int | str:
    """Check --qat-steps: 0 for off, a number of steps, or ``auto``, which trains only when PTQ
    int8 loses too much."""
    text = value.strip().lower()
    if text != "auto" and not text.isdigit():
        raise UserError(
            f"--qat-steps={value} is not allowed: expected 0 (off), a whole number of training steps, or auto"
        )
    steps: int | str = text if text == "auto" else int(text)
    if steps != 0 and quantize != "int8":
        raise UserError(
            f"--qat-steps={value} needs --quantize int8 (got --quantize {quantize}): quantization-aware "
            "training fine-tunes for static int8 only; drop --qat-steps or pass --quantize int8"
        )
    return steps


def _rules(c: ExportConfig) -> Iterator[tuple[bool, str, Any, str]]:
    yield c.batch_size > 0, "export.batch_size", c.batch_size, "an integer > 0"
    yield c.val_batches >= 0, "export.val_batches", c.val_batches, "an integer >= 0 (0 = the whole validation set)"
    yield c.calib_batches > 0, "export.calib_batches", c.calib_batches, "an integer > 0"
    yield c.max_batch >= 1, "export.max_batch", c.max_batch, "an integer >= 1"
    yield c.latency_batch > 1, "export.latency_batch", c.latency_batch, "an integer > 1 (batch 1 is always timed)"
    yield c.threads >= 0, "export.threads", c.threads, "an integer >= 0 (0 = the cores this process may use)"
    yield c.warmup >= 0, "export.warmup", c.warmup, "an integer >= 0"
    yield c.iterations >= 1, "export.iterations", c.iterations, "an integer >= 1"
    yield c.fp32_rtol > 0, "export.fp32_rtol", c.fp32_rtol, "a number > 0"
    yield 0 < c.retrain_frac <= 1, "export.retrain_frac", c.retrain_frac, "a share of the run's steps in (0, 1]"
    yield 0 < c.finetune_frac <= 1, "export.finetune_frac", c.finetune_frac, "a share of the run's steps in (0, 1]"
    yield c.finetune_lr_factor > 0, "export.finetune_lr_factor", c.finetune_lr_factor, "a number > 0"
    yield c.taylor_batches > 0, "export.taylor_batches", c.taylor_batches, "an integer > 0"
    yield c.round_to >= 1, "export.round_to", c.round_to, "an integer >= 1 (1 = exact channel counts)"
    yield c.reduce_range in SWITCHES, "export.reduce_range", c.reduce_range, f"one of {', '.join(SWITCHES)}"
    yield 0 < c.qat_frac <= 1, "export.qat_frac", c.qat_frac, "a number in (0, 1]"
    yield c.qat_lr_factor > 0, "export.qat_lr_factor", c.qat_lr_factor, "a number > 0"
    yield 0 < c.qat_momentum <= 1, "export.qat_momentum", c.qat_momentum, "a number in (0, 1]"


def load_settings(overrides: list[str]) -> ExportConfig:
    """Compose conf/export/<option>.yaml with the user's overrides. Raise a UserError naming a
    bad key or value."""
    from fwk.config.compose import compose_group

    cfg = ExportConfig(**compose_group("export", ExportConfig, overrides))
    if cfg.reduce_range in ("True", "False"):  # Hydra reads `export.reduce_range=true` as a bool, typed 'True'
        cfg.reduce_range = cfg.reduce_range.lower()
    for ok, key, value, allowed in _rules(cfg):
        if not ok:
            raise UserError(f"{key}={value!r} is not allowed: expected {allowed} (fix it with {key}=...)")
    return cfg
