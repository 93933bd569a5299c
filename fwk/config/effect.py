"""The checks that refuse, at launch, settings that could never take effect in this run.

Each refusal is one line naming the key and what would work, before any run dir exists.
``resolve.check_inputs`` calls ``check``, so ``fwk train --dry-run`` does too, without torch.

These are launch checks, not ``validate.to_typed`` rules: a config already in a run dir is
read back by its workers and by ``fwk export`` whatever a later launch would refuse. Each check
is named by its option. A method's checks are its settings' ``effects(c)``, in its own file.
The evaluation schedule they share is the loop's (fwk/engine/trainer.py). It evaluates every
``train.eval_every`` steps and after the last one.
"""

from __future__ import annotations

from collections.abc import Iterator

from fwk.config.schema import CheckpointConfig, Config, TrainConfig
from fwk.config.target import parse_target
from fwk.errors import UserError


def check(c: Config) -> None:
    """Raise UserError on the first setting of ``c`` that this run could never act on."""
    for problem in _problems(c):
        raise UserError(problem)


def _problems(c: Config) -> Iterator[str]:
    yield from _stop_at(c.train)
    yield from _early_stop_patience(c.train)
    yield from _best(c.checkpoint, c.train)
    for name in c.methods:  # a method's settings that its run could never act on (its ``effects``)
        effects = getattr(getattr(c.method, name), "effects", None)
        if effects is not None:
            yield from effects(c)


def evaluations_before_end(t: TrainConfig) -> int:
    """Count the evaluations before the last step's: those a target or a patience can end the run at."""
    return (t.max_steps - 1) // t.eval_every if t.eval_every > 0 else 0


def _only_at_end(t: TrainConfig) -> str:
    if t.eval_every == 0:
        return "train.eval_every=0 evaluates only at the end"
    return f"train.eval_every={t.eval_every} evaluates only at the end of train.max_steps={t.max_steps}"


def _more_evaluations(t: TrainConfig) -> str:
    if t.max_steps < 2:
        return "train more than one step (train.max_steps) and set train.eval_every=N"
    return f"set train.eval_every=N below train.max_steps={t.max_steps} (e.g. {max(1, t.max_steps // 10)})"


def _stop_at(t: TrainConfig) -> Iterator[str]:
    if not t.stop_at:
        return
    unreachable = parse_target(t.stop_at).unreachable()  # its syntax was validated with the config
    if unreachable:
        yield f"train.stop_at={t.stop_at!r} {unreachable}"
    elif not evaluations_before_end(t):
        yield f"train.stop_at is checked only at evaluations, and {_only_at_end(t)}: {_more_evaluations(t)}"


def _early_stop_patience(t: TrainConfig) -> Iterator[str]:
    patience, before = t.early_stop_patience, evaluations_before_end(t)
    if not patience:
        return
    if not before:
        yield f"train.early_stop_patience={patience} counts evaluations, and {_only_at_end(t)}: {_more_evaluations(t)}"
        return
    if before > patience:  # the earliest stop: a best, then `patience` evaluations without a new one
        return
    fixes = [f"train.early_stop_patience to {before - 1}"] if before > 1 else []
    if (t.max_steps - 1) // (patience + 1):
        fixes.append(f"train.eval_every to {(t.max_steps - 1) // (patience + 1)}")
    yield (
        f"train.early_stop_patience={patience} can never end this run early: it stops at evaluation {patience + 1} "
        f"at the earliest, and train.eval_every={t.eval_every} gives {before} before the end of "
        f"train.max_steps={t.max_steps}; " + ("lower " + ", or ".join(fixes) if fixes else "raise train.max_steps")
    )


def _best(ck: CheckpointConfig, t: TrainConfig) -> Iterator[str]:
    if ck.best and not evaluations_before_end(t):
        yield (
            f"checkpoint.best={ck.best} ranks evaluations, and {_only_at_end(t)}: the best checkpoint would be "
            f"the final one; {_more_evaluations(t)}, or leave checkpoint.best empty"
        )
    for key, value in (("min_improvement", ck.min_improvement), ("patience", ck.patience)):
        if value and not ck.best:
            yield (
                f"checkpoint.{key}={value:g} applies to the best checkpoint, and checkpoint.best is empty: "
                f"set checkpoint.best=val_acc (or val_loss), or drop checkpoint.{key}"
            )
