"""Numeric precision: config group ``precision`` (read here and nowhere else).

- ``fp32``: no autocast.
- ``bf16``: autocast to bfloat16. Weights, gradients and optimizer state stay fp32.
- ``fp16``: autocast to float16 with dynamic loss scaling (``torch.amp.GradScaler``): a
  step with inf/NaN gradients is skipped and counted, and the scale backs off.
- ``staged``: fp32 warm-up -> AMP -> final phase with ``final_fp32`` back in fp32.
- ``auto``: measured (``auto_precision.py``). Where fp16 may run, the first ``probe_steps``
  record per-module value ranges, and the modules near fp16's limit join ``keep_fp32``. Then
  the hardware's one reduced format is timed against fp32 and kept only if faster.

``keep_fp32`` modules run with autocast disabled and their inputs cast up to fp32.
A step calls precision through its per-step hooks (``fwk/strategies/per_step.py``): ``begin``,
``around_forward`` (autocast), and fp16's loss scaling (``loss_scale.py``). The state, with the
scaler and auto's choice and ranges, is part of the checkpoint, and the phase follows from the
step, so resume is exact.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from fwk.config.schema import PrecisionConfig
from fwk.distributed.collectives import all_reduce_max
from fwk.distributed.group import Dist
from fwk.distributed.sharded import is_dtensor
from fwk.errors import UserError
from fwk.strategies import hardware
from fwk.strategies.auto_precision import AutoChoice
from fwk.strategies.decisions import Decisions
from fwk.strategies.hardware import choose_format
from fwk.strategies.islands import Gate, fp32_forward
from fwk.strategies.loss_scale import LossScale
from fwk.strategies.modules import fitting, last_linear, match, outermost, wrap_forward
from fwk.strategies.per_step import PerStep
from fwk.strategies.ranges import RangeProbe, describe

logger = logging.getLogger(__name__)

FP16_MAX = 65504.0
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_model(cfg: PrecisionConfig, model: nn.Module, device: torch.device, typed: Collection[str] = ()) -> None:
    """Check before any work that the module patterns the user typed match modules, and that the
    device runs the asked format. ``typed`` holds keys such as ``precision.keep_fp32``, and a
    UserError says what fails. A recipe's default patterns apply where they match (``modules.fitting``)."""
    for key, patterns in (("precision.keep_fp32", cfg.keep_fp32), ("precision.final_fp32", cfg.final_fp32)):
        if key in typed:
            match(model, patterns, key)
    wants_fp16 = cfg.name == "fp16" or (cfg.name == "staged" and cfg.dtype == "fp16")
    if wants_fp16 and not hardware.probe(device).fp16_works:
        raise UserError(
            f"precision fp16 is not supported on {hardware.probe(device).text}; use precision=bf16, fp32 or auto"
        )


class Precision(PerStep):
    def __init__(
        self,
        cfg: PrecisionConfig,
        dist: Dist,
        max_steps: int,
        decisions: Decisions | None = None,
        deterministic: bool = False,
    ) -> None:
        """Set up precision. ``decisions`` is where auto's decision is recalled from and kept, and
        with None it is measured, not cached. Under ``deterministic`` (train.deterministic) auto
        keeps the hardware's prior untimed."""
        self.cfg, self.dist, self.decisions = cfg, dist, decisions
        self.device_type = dist.device.type
        features = hardware.probe(dist.device)
        self.auto: AutoChoice | None = None  # precision=auto's measured choice
        self.loss_scale = LossScale(cfg, dist.device)
        self._features = features
        if cfg.name == "auto":
            self.format = choose_format(features, dist.device)
            self.auto = AutoChoice(cfg, dist, decisions, self.format, features, max_steps, deterministic)
        elif cfg.name == "staged":
            # an explicit staged run wants AMP: fp16 where auto would pick it, else bf16 (range-safe)
            auto = "fp16" if choose_format(features, dist.device) == "fp16" else "bf16"
            self.format = cfg.dtype if cfg.dtype != "auto" else auto
        else:
            self.format = cfg.name
        warmup = cfg.warmup_steps or round(cfg.warmup_frac * max_steps)
        final = round(cfg.final_frac * max_steps)
        # (first step, phase) pairs. A step runs in the last phase whose start it has reached
        self.phases = (
            [(0, "warmup"), (warmup, "main"), (max_steps - final, "final")] if cfg.name == "staged" else [(0, "main")]
        )
        self.phase: str | None = None
        self._fit_scaler()
        self._keep, self._final = Gate(), Gate()
        self._kept: set[str] = set()
        self.keep_patterns: list[str] = []  # keep_fp32's patterns that match this model (prepare)
        self._model: nn.Module | None = None
        self._convs = False  # prepare() looks
        self._probe: RangeProbe | None = None
        self.ranges: dict[str, tuple[float, float]] = {}
        self.probe_done = self.auto is None or not self.auto.probes
        self._ranges_said = False

    @property
    def fast(self) -> str | None:
        """Return auto's reduced format worth timing, or None for fp32 only and when not auto."""
        return self.auto.fast if self.auto is not None else None

    @property
    def trial_end(self) -> int:
        """Return the first step after auto's trial, or 0 when there is none."""
        return self.auto.trial_end if self.auto is not None else 0

    @property
    def decided(self) -> bool:
        """Tell whether precision is settled: auto's range probe and trial are over. The next
        decision, memory's, may then time its own steps."""
        return self.probe_done and (self.auto is None or self.auto.record is not None)

    @property
    def timing(self) -> bool:
        """Tell whether step times feed auto's decision now. A CUDA step is then synchronized."""
        return self.auto is not None and self.auto.timing

    @property
    def trying(self) -> bool:
        """Tell whether this step belongs to auto's trial, which ``fwk/components/trials.py`` redoes."""
        return self.auto is not None and self.auto.trying

    def rewind(self, before: dict[str, Any]) -> None:
        """Prepare to redo the steps since ``before``, this state then, keeping auto's decision. The
        loss scale goes back to what it was, and the range probe runs again, as a recalled run
        probes in its format."""
        if self.auto is not None:
            self.auto.rewind()
        self.loss_scale.load_state_dict(before)
        if not before["probe_done"] and self.probe_done and self._model is not None:
            self.ranges, self.probe_done = {n: (float(a), float(g)) for n, (a, g) in before["ranges"].items()}, False
            self._probe = RangeProbe(self._model)

    def step_done(self, step: int, seconds: float) -> None:
        """Hand auto's trial the step's time after each optimizer step. The trial may then decide."""
        line = self.auto.step_done(step, seconds) if self.auto is not None else None
        if line and self.dist.is_main:
            logger.info(line)

    def _fit_scaler(self) -> None:
        """Fit a loss scaler when fp16 may run: asked for, auto's choice, or on auto's trial."""
        choice = self.auto.choice if self.auto is not None else None
        if "fp16" in (self.format, self.fast, choice):
            self.loss_scale.fit()

    # ---- set-up -------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> nn.Module:
        """Install fp32 islands, channels-last and the range probe on the plain model."""
        check_model(self.cfg, model, self.dist.device)  # the patterns the user typed were checked before the launch
        self._model = model
        self.keep_patterns, left_out = fitting(model, self.cfg.keep_fp32, "precision.keep_fp32")
        self._keep_fp32(match(model, self.keep_patterns, "precision.keep_fp32"), self._keep)
        if self.cfg.name == "staged":
            final, final_left_out = fitting(model, self.cfg.final_fp32, "precision.final_fp32")
            self._keep_fp32(match(model, final or last_linear(model), "precision.final_fp32"), self._final)
            left_out = "; ".join(line for line in (left_out, final_left_out) if line) or None
        if left_out and self.dist.is_main:
            logger.info(left_out)
        self._convs = any(isinstance(m, nn.Conv2d) for m in model.modules())
        self.channels_last = self._layout_at(0)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if not self.probe_done:
            self._probe = RangeProbe(model)
        if self.dist.is_main:
            logger.info(self._describe())
        return model

    def _keep_fp32(self, modules: dict[str, nn.Module], gate: Gate) -> None:
        # a model's head_loss (the GPT's; kernels' fused one) computes its head_of's output
        # without calling that module: an island around the module covers head_loss too
        head = getattr(self._model, "head_of", None)
        for name, module in outermost(modules).items():
            if name not in self._kept:
                wrap_forward(module, fp32_forward(gate, self.device_type))
                self._kept.add(name)
                if head is not None and name and (head == name or head.startswith(f"{name}.")):
                    self._model.head_loss = fp32_forward(gate, self.device_type)(self._model.head_loss)

    @property
    def amp_possible(self) -> bool:
        """Tell whether autocast may run in this run: an AMP format asked for, or one auto may choose."""
        return self.fast is not None if self.cfg.name == "auto" else self.format != "fp32"

    def _layout_at(self, step: int) -> bool:
        """Tell whether ``step`` runs channels-last: ``channels_last=auto`` on conv nets under AMP.
        Under auto that is a function of the step, as the format is. It is channels-last through
        the trial, the AMP candidate's layout, then as the choice asks. So a cached, resumed or
        replayed run has each step in the layout the first run gave it."""
        switch = self.cfg.channels_last.lower()
        if switch != "auto" or not self._convs:
            return switch == "true"
        if self.auto is None:
            return self.format != "fp32"
        return self.auto.channels_last_at(step)

    def _relayout(self, step: int) -> None:
        """Switch to the layout of ``step`` under auto, when it differs from the last step's. That
        happens at most at the trial's end, and on resume. The weights are converted in place, so
        the optimizer keeps the same parameters, but not sharded ones, which FSDP keeps contiguous anyway."""
        if self._model is None:
            return
        want = self._layout_at(step)
        if want == self.channels_last:
            return
        self.channels_last = want
        if not any(is_dtensor(p) for p in self._model.parameters()):
            self._model.to(memory_format=torch.channels_last if want else torch.contiguous_format)
        if self.dist.is_main:
            logger.info(f"step {step}: precision=auto runs {'channels-last' if want else 'contiguous'} from here")

    def _describe(self) -> str:
        extras = []
        if self.keep_patterns and self.amp_possible:
            extras.append(f"keep_fp32 {', '.join(self.keep_patterns)}")
        if self.channels_last:
            extras.append("channels_last")
        slow = hardware.slow_here(self.format, self._features, self.dist.device) if self.cfg.name != "auto" else None
        if slow:
            extras.append(f"slow here: {slow}")
        tail = f" ({'; '.join(extras)})" if extras else ""
        if self.auto is not None:
            return f"{self.auto.line}{tail}"
        if self.cfg.name == "staged":
            spans = zip(self.phases, [s for s, _ in self.phases[1:]] + [None], strict=True)
            starts = ", ".join(f"{p} from step {s}" for (s, p), end in spans if end is None or end > s)
            return f"precision=staged ({self.format}): {starts}{tail}"
        return f"precision={self.format}{tail}"

    # ---- for sharded data parallelism ---------------------------------------------
    def sharded_param_dtype(self) -> torch.dtype | None:
        """Return FSDP's mixed-precision parameter dtype: the AMP dtype asked for, bf16 or fp16. It
        is None, for fp32 parameters and autocast alone, when the format may change (staged, auto),
        so that the sharding never depends on the cache."""
        if self.format == "fp32" or self.cfg.name in ("staged", "auto"):
            return None
        return _DTYPES[self.format]

    def fp32_islands(self) -> list[nn.Module]:
        """Return the modules kept in fp32 (``keep_fp32``, staged ``final_fp32``), outermost only."""
        assert self._model is not None, "prepare() first"
        named = dict(self._model.named_modules())
        return [named[n] for n in sorted(self._kept)]

    # ---- per step -----------------------------------------------------------------
    def begin(self, step: int, turn: bool = True) -> bool:
        """End the range probe, set auto's format for the step and switch staged phases, before each
        step. Precision decides first, and the next decision may once it has."""
        if self.auto is not None:
            self.format = self.auto.format_at(step)
            self._relayout(step)
        if self._probe is not None and step >= self.cfg.probe_steps:
            self._finish_probe()
        phase = [p for start, p in self.phases if step >= start][-1]
        if phase != self.phase:
            if self.phase is not None and self.dist.is_main:
                logger.info(f"step {step}: precision phase {self.phase} -> {phase} ({self._phase_text(phase)})")
            self.phase = phase
        self._keep.on = self.amp_on
        self._final.on = self.amp_on and self.phase == "final"
        return self.decided

    def _phase_text(self, phase: str) -> str:
        texts = {"warmup": "fp32", "main": f"{self.format} autocast", "final": f"{self.format}, final layers fp32"}
        return texts[phase]

    @property
    def amp_on(self) -> bool:
        """Tell whether autocast runs now. It does not during fp32 warm-up, nor while auto probes fp16 ranges."""
        if self.format == "fp32" or self.phase == "warmup":
            return False
        return not (self.format == "fp16" and self._probe is not None)

    def compute_dtype(self) -> torch.dtype:
        """Return the dtype the step's matmuls run in now: the autocast format while it is on, else fp32."""
        return _DTYPES[self.format] if self.amp_on else torch.float32

    def autocast(self) -> AbstractContextManager:
        if not self.amp_on:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=_DTYPES[self.format])

    around_forward = autocast  # the step's hook (PerStep) is autocast

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    @property
    def scaling(self) -> bool:
        """Tell whether this step's loss is scaled: under fp16, but not in auto's fp32 trial steps."""
        return self.loss_scale.fitted and self.format == "fp16"

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.loss_scale.scale(loss) if self.scaling else loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Give the gradients their true values before they are clipped. Under fp16 they are scaled."""
        if self.scaling:
            self.loss_scale.unscale(optimizer)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Let the scaler step under fp16, and say whether it did. A step with inf/NaN gradients is
        skipped, and counted."""
        if self.scaling:
            self.loss_scale.step(optimizer)
        return self.scaling

    # ---- auto's range probe -------------------------------------------------------
    def _finish_probe(self) -> None:
        assert self._probe is not None and self._model is not None
        self._probe.remove()
        seen = self._probe.read()
        self._probe = None
        names = list(seen)
        values = all_reduce_max([v for n in names for v in seen[n]], self.dist)
        for i, n in enumerate(names):
            old = self.ranges.get(n, (0.0, 0.0))
            self.ranges[n] = (max(old[0], values[2 * i]), max(old[1], values[2 * i + 1]))
        self.probe_done = True
        self._apply_ranges(announce=not self._ranges_said)  # said once: a trial's probe is redone
        self._ranges_said = True

    def _apply_ranges(self, announce: bool) -> None:
        """Add to keep_fp32, under fp16, the modules whose values come near fp16's limit."""
        assert self._model is not None
        limit = FP16_MAX / self.cfg.fp16_headroom
        fp16 = "fp16" in (self.format, self.fast)
        hot = [n for n, (a, g) in self.ranges.items() if max(a, g) > limit] if fp16 else []
        if hot:
            self._keep_fp32({n: m for n, m in self._model.named_modules() if n in hot}, self._keep)
        if announce and self.dist.is_main and self.ranges:
            logger.info(f"precision=auto {describe(self.ranges, self.cfg.probe_steps, hot, limit)}")

    # ---- reporting and checkpoint state ------------------------------------------
    def metrics(self) -> dict[str, Any]:
        row: dict[str, Any] = {}
        if self.cfg.name == "staged":
            row["phase"] = self.phase
        return {**row, **self.loss_scale.metrics()}

    def summary(self) -> dict[str, Any]:
        chosen = (self.auto.choice if self.auto is not None else None) or self.format
        return {"precision": chosen, "skipped_steps": int(self.loss_scale.skipped)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            **self.loss_scale.state_dict(),  # skipped, scaler
            "probe_done": self.probe_done,
            "ranges": {n: list(v) for n, v in self.ranges.items()},
            **(self.auto.state_dict() if self.auto is not None else {}),  # auto: decision, or trial under way
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.auto is not None and "trial" in state:
            line = self.auto.load_state_dict(state)
            if line and self.dist.is_main:
                logger.info(line)
            self._fit_scaler()
        elif state["format"] != self.format:
            raise UserError(
                f"the checkpoint was trained with {state['format']} but precision={self.cfg.name} now chooses "
                f"{self.format} on this machine; resume on the same hardware or set precision={state['format']}"
            )
        self.loss_scale.load_state_dict(state)
        self.ranges = {n: (float(a), float(g)) for n, (a, g) in state["ranges"].items()}
        if state["probe_done"] and self._probe is not None:
            self._probe.remove()
            self._probe = None
            self.probe_done = True
            self._apply_ranges(announce=False)
