"""The export config group: composed with Hydra's grammar, typed, range-checked in one line."""

from __future__ import annotations

import pytest

from fwk.config.export_schema import ExportConfig
from fwk.errors import UserError
from fwk.export.settings import check_quantize, load_settings


def test_defaults_come_from_the_schema() -> None:
    assert load_settings([]) == ExportConfig()


def test_overrides_are_typed() -> None:
    cfg = load_settings(["export.calib_batches=3", "export.per_channel=false", "export.fp32_rtol=1e-3"])
    assert (cfg.calib_batches, cfg.per_channel, cfg.fp32_rtol) == (3, False, 1e-3)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["export.calib_batches=0"], "export.calib_batches=0 is not allowed: expected an integer > 0"),
        (["export.latency_batch=1"], "export.latency_batch=1 is not allowed: expected an integer > 1"),
        (["export.reduce_range=maybe"], "export.reduce_range='maybe' is not allowed: expected one of auto, true"),
        (["export.nope=1"], "unknown key 'export.nope'; valid keys here: name, batch_size,"),
        (["export.iterations=many"], "export.iterations='many' is not allowed: expected an integer"),
        (["export=fast"], "unknown export 'fast'; choose one of: default"),
        (["train.max_steps=3"], "'train.max_steps=3' is not an override of the export group"),
    ],
)
def test_mistakes_are_one_line(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError) as err:
        load_settings(overrides)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_quantize_options() -> None:
    assert check_quantize("dynamic_int8") == "dynamic_int8"
    with pytest.raises(UserError, match="--quantize=int4 is not allowed: expected one of none, int8"):
        check_quantize("int4")
