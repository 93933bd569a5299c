"""precision=auto's measured choice: which format each step runs in, and why.

The hardware's prior names the one reduced format worth trying, ``fast``, which is None when
only fp32 is. From the first step, or under fp16 after the range probe (``probes``),
``trial_steps`` real training steps of it and of fp32 are timed, interleaved
(``trial_order``). The reduced format is kept only if it is ``min_speedup`` times faster.
The step times' medians are all-reduced, so every rank takes the same decision. A
decision may instead be recalled, cached or replayed (``decisions.py``), and then holds
from step 0 without a trial. A measured one holds from step 0 too: once it is made, the loop
redoes the probe and trial steps in the chosen format (``fwk/components/trials.py``,
``rewind``), so both compute the same thing. ``Precision`` asks ``format_at(step)``
before each step and hands back each step's time.
"""

from __future__ import annotations

import statistics
from typing import Any

from fwk.config.schema import PrecisionConfig
from fwk.distributed.collectives import all_reduce_max
from fwk.distributed.group import Dist
from fwk.strategies import hardware
from fwk.strategies.decisions import Decisions

Record = dict[str, Any]


def trial_order(fast: str, steps: int) -> list[str]:
    """Return the formats of auto's trial steps. One untimed warm-up step of each comes first,
    since the first step of a format pays its one-time costs. Then ``steps`` timed pairs
    alternate which goes first, since a step right after the other format's runs a little slower."""
    order = ["fp32", fast]
    for r in range(steps):
        order += ["fp32", fast] if r % 2 == 0 else [fast, "fp32"]
    return order


def compared(fast: str, fast_ms: float, fp32_ms: float) -> str:
    """Put a trial's figures in words: ``bf16 2.07x slower than fp32 (12 vs 5.77 ms/step``."""
    speedup = fp32_ms / fast_ms
    ratio = f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"
    return f"{fast} {ratio} than fp32 ({fast_ms:.3g} vs {fp32_ms:.3g} ms/step"


class AutoChoice:
    def __init__(
        self,
        cfg: PrecisionConfig,
        dist: Dist,
        decisions: Decisions | None,
        prior: str,
        features: hardware.Features,
        max_steps: int,
        deterministic: bool,
    ) -> None:
        self.cfg, self.dist, self.decisions = cfg, dist, decisions
        self.fast: str | None = None if prior == "fp32" else prior
        self.trial: dict[str, Any] | None = None  # {"start": step, "order": [formats]}
        self.times: dict[str, list[float]] = {}
        self.record: Record | None = None  # the decision, once made or recalled
        self.source = ""
        self.line = ""  # what precision's first line says
        record, source = decisions.recall("precision") if decisions is not None else (None, "")
        if record is not None:
            self._adopt(record, source)
        else:
            self._plan(features, max_steps, deterministic)

    def _plan(self, features: hardware.Features, max_steps: int, deterministic: bool) -> None:
        start = self.cfg.probe_steps if self.probes else 0
        order = trial_order(self.fast, self.cfg.trial_steps) if self.fast else []
        prior = self.fast or "fp32"
        if not self.fast:
            why = f"{features.text}, no fast bf16 units (an emulated format is not tried)"
        elif deterministic:
            why = f"{features.text}; not timed against fp32 (train.deterministic=true)"
        elif start + len(order) >= max_steps:
            why = f"{features.text}; {max_steps} steps are too few to time {self.fast} against fp32"
        elif start + len(order) > self.cfg.max_trial_share * max_steps:
            # the trial's steps are redone once decided: a short run would pay more for them than
            # a wrong prior is likely to cost it
            why = (
                f"{features.text}; untimed: the {start + len(order)} trial steps, redone once decided, would be "
                f"{(start + len(order)) / max_steps:.0%} of this run's {max_steps} steps, over "
                f"precision.max_trial_share={self.cfg.max_trial_share:g} (a longer run times it)"
            )
        else:
            self.trial = {"start": start, "order": order}
            self.times = {f: [] for f in (self.fast, "fp32")}
            self.line = (
                f"precision=auto: {features.text}; timing {self.fast} against fp32 on steps {start}-"
                f"{start + len(order) - 1} ({self.cfg.trial_steps} steps each, interleaved) before choosing"
            )
            return
        self._decided({"choice": prior, "fast": self.fast, "trial": None}, "hardware")
        self.line = f"precision=auto chose {prior}: {why}"

    def _adopt(self, record: Record, source: str) -> None:
        """Follow a recalled decision from step 0, without a trial."""
        self.fast = record.get("fast")
        self.trial = None
        self._decided({**record, "trial": None}, source)  # this run has no trial steps
        choice, ms = record["choice"], record.get("ms") or {}
        if source == "cached" and self.fast and ms:
            figures = compared(self.fast, ms[self.fast], ms["fp32"])
            self.line = (
                f"precision=auto chose {choice} as measured before for this model on this machine: {figures}; "
                "auto.cache=false or --redecide measures again)"
            )
        elif source == "cached":
            self.line = f"precision=auto chose {choice} as decided before for this model on this machine"
        else:
            self.line = f"precision=auto re-applies {choice}, as the {source} run decided (--redecide decides afresh)"

    def _decided(self, record: Record, source: str) -> None:
        self.record, self.source = record, source
        if self.decisions is not None:
            self.decisions.keep("precision", record, source)

    @staticmethod
    def _end(trial: dict[str, Any] | None) -> int:
        return trial["start"] + len(trial["order"]) if trial is not None else 0

    @property
    def probes(self) -> bool:
        """Tell whether the range probe (``precision.py``) runs first. Its ranges pick the modules
        fp16 keeps in fp32, so only a run that may run fp16 needs them."""
        return self.fast == "fp16" and self.cfg.probe_steps > 0

    @property
    def trial_end(self) -> int:
        """Return the first step after the trial, or 0 when there is none."""
        return self._end(self.trial)

    @property
    def choice(self) -> str | None:
        return self.record["choice"] if self.record is not None else None

    def format_at(self, step: int) -> str:
        """Return the format of ``step``. Before a trial, in fp16's range probe steps, that is the
        hardware's prior. A trial step has its own, and the decision holds once made."""
        if self.trial is not None and step < self.trial_end:
            start = self.trial["start"]
            return self.trial["order"][step - start] if step >= start else self.fast or "fp32"
        return self.choice or self.fast or "fp32"

    def channels_last_at(self, step: int) -> bool:
        """Tell whether ``step`` is channels-last: AMP's layout through the trial, then the choice's.
        A trial implies an AMP candidate."""
        if self.trial is not None and step < self.trial_end:
            return True
        return (self.choice or self.fast or "fp32") != "fp32"

    @property
    def timing(self) -> bool:
        """Tell whether step times feed the decision now. A CUDA step is then synchronized."""
        return self.trial is not None and self.record is None

    @property
    def trying(self) -> bool:
        """Tell whether the steps now run a trial, its probe steps included, that a recalling run
        would not. The loop redoes them in the chosen format once decided."""
        return self.timing

    def rewind(self) -> None:
        """Drop the trial, whose steps are redone in the chosen format from the start, as a
        recalled decision runs. The decision's record keeps the trial's steps and times."""
        if self.record is not None:
            self.trial, self.times = None, {}

    def step_done(self, step: int, seconds: float) -> str | None:
        """Collect each trial step's time, warm-ups excepted, and decide after the trial's last
        step. Return the decision's line then."""
        if not self.timing:
            return None
        assert self.trial is not None
        i, order = step - self.trial["start"], self.trial["order"]
        if 2 <= i < len(order):
            self.times[order[i]].append(seconds)
        return self._judge() if i == len(order) - 1 else None

    def _judge(self) -> str:
        assert self.fast is not None and self.trial is not None
        medians = [statistics.median(self.times[self.fast]), statistics.median(self.times["fp32"])]
        fast, fp32 = all_reduce_max(medians, self.dist)
        speedup = fp32 / fast
        choice = self.fast if speedup >= self.cfg.min_speedup else "fp32"
        ms = {self.fast: fast * 1000, "fp32": fp32 * 1000}
        self._decided({"choice": choice, "fast": self.fast, "trial": self.trial, "ms": ms}, "measured")
        line = f"precision=auto chose {choice}: {compared(self.fast, ms[self.fast], ms['fp32'])}, "
        line += f"{self.cfg.trial_steps} steps each)"
        if choice == "fp32" and speedup >= 1:
            line += f", less than precision.min_speedup={self.cfg.min_speedup:g}"
        return line

    # ---- checkpoint state ---------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return the decision, or the trial under way with its times so far."""
        return {"decision": self.record, "trial": self.trial, "times": self.times}

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """Follow what a resumed run decided, or go on with its trial. Never follow the cache,
        whose record may have come from another run since. Return a line when the
        checkpoint's choice differs from the one recalled at start."""
        before = self.choice
        self.trial, self.times = state.get("trial"), state.get("times") or {}
        record = state.get("decision")
        if record is None:
            self.record, self.source = None, ""
            return None
        self.fast = record.get("fast")
        self._decided(record, "checkpoint")
        if record["choice"] == before:
            return None
        return f"precision=auto keeps {record['choice']}, as it decided before the checkpoint"
