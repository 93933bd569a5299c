"""Each method's settings check themselves (``rules``): a bad value, or a method that cannot
run with the rest of the config, is one line naming the key; validate names no method."""

from __future__ import annotations

import pytest

from fwk.config.compose import compose
from fwk.config.methods import METHODS
from fwk.config.schema import MethodConfig
from fwk.config.validate import to_typed
from fwk.errors import UserError


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["method.ema.half_life=0"], "method.ema.half_life=0.0 is not allowed: expected a number of steps > 0"),
        (["methods=[ema]", "parallel=fsdp", "parallel.nproc_per_node=2"], "expected no ema with parallel=fsdp/hsdp"),
        (["method.label_smoothing.smoothing=1"], "method.label_smoothing.smoothing=1.0 is not allowed"),
        (["method.seq_warmup.start_len=0"], "method.seq_warmup.start_len=0 is not allowed: expected an integer >= 1"),
        (["method.seq_warmup.duration=1.5"], "method.seq_warmup.duration=1.5 is not allowed"),
        (["method.progressive_resize.initial_scale=0"], "method.progressive_resize.initial_scale=0.0 is not"),
        (
            ["method.progressive_resize.delay_fraction=0.9"],
            "expected a share in [0, 1] with delay_fraction + finetune_fraction <= 1",
        ),
        (["method.prune_gradually.ratio=1"], "method.prune_gradually.ratio=1.0 is not allowed: expected a share"),
        (["method.prune_gradually.start=0.6"], "method.prune_gradually.start=0.6 is not allowed"),
        (["methods=[prune_gradually,ema]"], "expected no ema with prune_gradually"),
        (["methods=[prune_gradually]", "memory=checkpoint"], "memory.name='checkpoint' is not allowed: expected none"),
        (["method.early_exit.exits=[3,3]"], "method.early_exit.exits=[3, 3] is not allowed: expected block indices"),
        (["method.early_exit.exits=[0]", "method.early_exit.weights=[1,1]"], "expected one weight per exit"),
        (["method.early_exit.weights=[0]"], "method.early_exit.weights=[0.0] is not allowed: expected loss weights"),
        (["method.early_exit.max_drop=-0.1"], "method.early_exit.max_drop=-0.1 is not allowed: expected a number >= 0"),
        (["methods=[early_exit,ema]"], "expected no ema with early_exit"),
        (["methods=[early_exit]", "parallel=fsdp", "parallel.nproc_per_node=2"], "parallel.name='fsdp' is not allowed"),
        (["optim=adamw_schedulefree", "optim.bn_batches=-1"], "optim.bn_batches=-1 is not allowed"),
        (["optim=adamw_schedulefree", "methods=[ema]"], "expected no ema with optim=adamw_schedulefree"),
    ],
)
def test_a_methods_own_rule_is_one_line(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError) as info:
        to_typed(compose(overrides))
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_every_method_has_its_settings_and_its_rules() -> None:
    cfg = to_typed(compose([]))
    for name in METHODS.names():
        settings = getattr(MethodConfig(), name)
        assert list(settings.rules(cfg)), name  # each checks at least its own values
        assert all(ok for ok, *_ in settings.rules(cfg)), name  # and its defaults pass them


def test_each_file_of_fwk_methods_registers_one_method_and_its_settings() -> None:
    import pkgutil

    import fwk.methods

    files = sorted(m.name for m in pkgutil.iter_modules(fwk.methods.__path__) if m.name != "base")
    owners = sorted(METHODS.get(name).builder.__module__.rpartition(".")[2] for name in METHODS.names())
    assert owners == files == METHODS.names()  # one method per file, named as its file
    for name in METHODS.names():
        assert METHODS.get(name).builder.__module__ == METHODS.config(name).__module__  # its settings beside it
