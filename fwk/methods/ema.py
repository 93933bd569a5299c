"""``ema``: an exponential moving average of the weights, buffers included
(``torch.optim.swa_utils.AveragedModel`` with an EMA multi-average function).

The average is a copy of the plain model made before any strategy wraps it. A copy of a
wrapped model would call the original's forwards. Evaluation, best checkpoints and
``fwk export`` use the average, and training goes on with the raw weights. ``half_life`` is
in steps: the decay per step is ``0.5 ** (1 / half_life)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fwk.config.methods import Config, Rule
from fwk.distributed.dims import shards_model
from fwk.methods.base import Method, method
from fwk.registry import doc

if TYPE_CHECKING:
    from torch import nn


@dataclass
class EmaConfig:
    """An exponential moving average of the weights, used by evaluation, best checkpoints and export."""

    half_life: float = doc(100.0, "steps over which an earlier weight's share in the average halves")

    def rules(self, c: Config) -> Iterator[Rule]:
        yield self.half_life > 0, "method.ema.half_life", self.half_life, "a number of steps > 0"
        if "ema" in c.methods:
            yield (
                not shards_model(c),
                "methods",
                list(c.methods),
                "no ema with parallel=fsdp/hsdp/tp/pp (the average would hold the whole model on every rank); "
                "use parallel=ddp",
            )


@method(EmaConfig)
class Ema(Method):
    name = "ema"

    def prepare(self, model: nn.Module) -> None:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        self.decay = 0.5 ** (1.0 / self.cfg.half_life)
        self.average = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(self.decay), use_buffers=True)

    def after_step(self, step: int, model: nn.Module) -> None:
        self.average.update_parameters(model)

    def evaluated(self, model: nn.Module) -> AbstractContextManager[nn.Module]:
        return nullcontext(self.average.module)

    @classmethod
    def exported(cls, state: dict[str, Any]) -> dict[str, Any] | None:
        """Return the averaged model's weights in a checkpoint's state, or None."""
        ema = (state.get("methods") or {}).get(cls.name)
        if not ema:
            return None
        return {k.removeprefix("module."): v for k, v in ema.items() if k.startswith("module.")}

    def describe(self) -> str:
        return (
            f"ema: weights averaged every step (half-life {self.cfg.half_life:g} steps, decay {self.decay:.5f}); "
            "evaluation, best checkpoints and fwk export use the average"
        )

    def state_dict(self) -> dict[str, Any]:
        return self.average.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.average.load_state_dict(state)
