"""The JIT layer: config group ``jit`` (read here and nowhere else).

- ``off``: eager.
- ``compile``: ``torch.compile`` from the first step.
- ``auto``: eager while recording each step's signature (input shapes, dtypes, strides,
  train/eval mode, grad mode, autocast). Once ``stable_steps`` steps in a row share one
  signature, and the steps left would take longer than ``min_remaining_s`` eagerly, the
  model is compiled and the compile time logged. On CPU the next ``trial_steps`` compiled
  steps are timed against the eager ones. Compiled is kept, and said, only when it is
  ``min_speedup`` times faster. A trial that ends eager is a first run's loss, so on CPU it is
  tried only when its cost, estimated from the model's size (``compile_estimate_s``), is at
  most ``max_trial_share`` of the eager time left. A first run, with no cached decision, then
  costs at most that share more than a later one. Steps in which another strategy still
  decides (precision, memory) do not count as stable. The measured step times are cached per
  machine and model (``decisions.py``). A later run, or a replay, decides from them without a
  trial and compiles at the same step. The trial's compiled steps are redone as decided
  (``fwk/components/trials.py``), so a measuring run computes what a recalling one does.

A signature the compiled model has not seen is compiled anew up to ``max_recompiles``
times, then runs eager, with one warning line. A compile error, raised in forward or in the
backward compiled lazily after it, falls back to eager for good and the step is redone
(``TrainStep`` asks ``recover``). Evaluation uses the plain model. Where compile stands
among the strategies is ``parallelize.py``'s to say.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fwk.config.schema import JitConfig
from fwk.distributed.collectives import all_reduce_max
from fwk.distributed.group import Dist
from fwk.strategies.decisions import Decisions
from fwk.strategies.per_step import PerStep

logger = logging.getLogger(__name__)

Signature = tuple
# Inductor's compile of a training step (forward and backward) on CPU, measured on a 2-core
# AVX2 EPYC (torch 2.14): ~6 s of set-up in a fresh process, then ~0.45 s per leaf module.
# The digits CNN (10 leaves) took 8 s, a 2-layer GPT (21) 10-18 s, ResNet-18 (52) 25 s and
# ResNet-50 (126) 50 s. It is a prior, not a promise: it decides only whether a trial is worth trying.
COMPILE_SETUP_S, COMPILE_PER_MODULE_S = 6.0, 0.45


def compile_estimate_s(model: nn.Module) -> float:
    """Return the seconds that compiling ``model``'s training step is expected to take on a CPU."""
    leaves = sum(1 for m in model.modules() if next(m.children(), None) is None)
    return COMPILE_SETUP_S + COMPILE_PER_MODULE_S * leaves


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def signature(module: nn.Module, args: tuple, kwargs: dict) -> Signature:
    """Return what decides whether a compiled graph can be reused for this call."""
    device = next((t.device.type for t in _tensors(args)), "cpu")
    autocast = torch.is_autocast_enabled(device)
    return (
        tuple((tuple(t.shape), t.dtype, t.stride(), t.requires_grad) for t in _tensors((args, kwargs))),
        module.training,
        torch.is_grad_enabled(),
        (autocast, torch.get_autocast_dtype(device) if autocast else None),
    )


class _Dispatch(nn.Module):
    """A module that calls the compiled model or the eager one, per call, as the Jit decides."""

    def __init__(self, model: nn.Module, jit: Jit) -> None:
        super().__init__()
        self.model = model
        self._jit = [jit]  # in a list: not a submodule

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._jit[0].call(self.model, args, kwargs)


class Jit(PerStep):
    def __init__(
        self,
        cfg: JitConfig,
        dist: Dist,
        max_steps: int,
        deterministic: bool = False,
        decisions: Decisions | None = None,
    ) -> None:
        """Set up the JIT layer. Under ``deterministic`` (train.deterministic) auto stays eager, since it
        decides from step times."""
        self.cfg, self.dist, self.max_steps, self.decisions = cfg, dist, max_steps, decisions
        self.record: dict[str, Any] | None = None  # auto's decision, once made or recalled
        self.cached: dict[str, Any] | None = None  # step times measured before for this model here
        self.cached_source = ""  # where they come from: cached, or replayed
        self._recalled = False
        self.compiled: Callable[..., Any] | None = None
        self.state = "off" if cfg.name == "off" else "eager"  # eager -> trial -> compiled, or off
        if cfg.name == "auto" and deterministic:
            self.state = "off"
            logger.info(
                "jit=auto stays eager: train.deterministic=true (compiling is decided from measured step times)"
            )
        self.step_sigs: list[Signature] = []  # signatures of this step's calls
        self.last: tuple | None = None
        self.run = 0  # consecutive steps with the same signatures
        self.eager_times: list[float] = []
        self.compiled_times: list[float] = []
        self.seen: set[Signature] = set()
        self.warned = False
        self.used_compiled = False
        self.compiled_at: int | None = None
        self._announced = False  # the first compiled step's time is said once (trial steps are redone)
        self._settled = True  # the decisions before jit's are made (begin)

    def wrap(self, model: nn.Module) -> nn.Module:
        """Return the model to train: ``model`` behind a switch between eager and compiled."""
        if self.cfg.name == "off":
            return model
        self.model = model
        if self.cfg.name == "compile":
            self._compile(0, why="jit=compile")
        return _Dispatch(model, self)

    # ---- per call and per step ------------------------------------------------------
    def call(self, model: nn.Module, args: tuple, kwargs: dict) -> Any:
        if self.state == "off":  # decided for eager: no signature work in the hot path
            return model(*args, **kwargs)
        sig = signature(model, args, kwargs)
        self.step_sigs.append(sig)
        if self.compiled is None or not model.training:
            return model(*args, **kwargs)
        if sig not in self.seen:
            if len(self.seen) > self.cfg.max_recompiles:
                if not self.warned and self.dist.is_main:
                    logger.info(
                        f"jit: more than jit.max_recompiles={self.cfg.max_recompiles} input signatures; "
                        "new ones run eager (raise jit.max_recompiles, or keep shapes fixed)"
                    )
                self.warned = True
                return model(*args, **kwargs)
            if self.seen and self.dist.is_main:
                logger.info(f"jit: new input signature {_short(sig)}: compiling it too")
            self.seen.add(sig)
        self.used_compiled = True
        return self.compiled(*args, **kwargs)

    def begin(self, step: int, turn: bool = True) -> bool:
        """Note whether the step is settled, and return ``turn``. ``turn`` is False while another
        strategy is still deciding, in auto precision's range probe or auto memory's trials.
        Those steps do not count as stable."""
        self._settled = turn
        return turn

    def step_done(self, step: int, seconds: float, settled: bool | None = None) -> None:
        """Decide what comes next, after each optimizer step. ``step`` is its 0-based index.
        ``settled``, when given, stands for ``begin``'s ``turn``."""
        settled = self._settled if settled is None else settled
        sigs, self.step_sigs = tuple(self.step_sigs), []
        used, self.used_compiled = self.used_compiled, False
        if self.state == "eager" and self.cfg.name == "auto":
            self.run = self.run + 1 if sigs == self.last and settled else int(settled)
            self.last = sigs
            self.eager_times = (self.eager_times + [seconds])[-self.cfg.stable_steps :]
            if settled and not self._recalled:
                self._recalled = True
                self._recall()
            if self.run >= self.cfg.stable_steps:
                self._maybe_compile(step)
        elif self.state in ("trial", "compiled") and used and step == self.compiled_at and not self._announced:
            self._announced = True
            if self.dist.is_main:
                logger.info(f"step {step}: compiled in {seconds:.1f} s (the first compiled step, compile included)")
        elif self.state == "trial" and used:
            self.compiled_times.append(seconds)
            if len(self.compiled_times) >= self.cfg.trial_steps:
                self._step = step
                self._judge()

    # ---- auto's decision: recalled, re-applied, or measured ---------------------------
    def _recall(self) -> None:
        """Recall a decision at the first settled step. A recalled decision, cached or replayed, gives
        the step times to decide from without timing, at the step a measuring run would compile."""
        record, source = self.decisions.recall("jit") if self.decisions is not None else (None, "")
        if record is not None:
            self.cached, self.cached_source = record, source

    def _keep(self, step: int, choice: str, compiled_ms: float | None, source: str = "measured") -> None:
        eager_ms = getattr(self, "eager_step", 0.0) * 1000
        self.record = {
            "choice": choice,
            "eager_ms": eager_ms,
            "compiled_ms": compiled_ms,
            "compile_at": self.compiled_at,
            "decided_at": step,
        }
        if self.decisions is not None:
            self.decisions.keep("jit", self.record, source)

    def _maybe_compile(self, step: int) -> None:
        cached = self.cached
        if cached is not None and cached.get("eager_ms"):
            per_step = cached["eager_ms"] / 1000  # the cached figure, not this run's timing
        else:
            per_step = all_reduce_max([statistics.median(self.eager_times)], self.dist)[0]
        left = (self.max_steps - step - 1) * per_step
        self.eager_step = per_step
        if left < self.cfg.min_remaining_s:
            self.state = "off"
            if self.dist.is_main:
                logger.info(
                    f"jit=auto stays eager: {self.max_steps - step - 1} steps left x {per_step * 1000:.0f} ms = "
                    f"{left:.0f} s, less than jit.min_remaining_s={self.cfg.min_remaining_s:g} (compiling costs)"
                )
            self._keep(step, "eager", None, self.cached_source or "measured")
            return
        why = f"jit=auto: {self.cfg.stable_steps} steps with one signature"
        measured = cached is not None and cached.get("compiled_ms")
        if not measured and self.dist.device.type == "cpu" and self._trial_too_dear(left):
            self._keep(step, "eager", None, self.cached_source or "measured")
            return
        if measured:
            speedup = cached["eager_ms"] / cached["compiled_ms"]
            cpu = self.dist.device.type == "cpu"
            if cpu and speedup < self.cfg.min_speedup:
                self.state = "off"
                if self.dist.is_main:
                    logger.info(
                        f"jit=auto stays eager, as measured before for this model on this machine ({speedup:.2f}x "
                        f"compiled, less than jit.min_speedup={self.cfg.min_speedup:g}; --redecide measures again)"
                    )
                self._keep(step, "eager", cached["compiled_ms"], self.cached_source)
                return
            self._compile(step + 1, why=f"{why}; compiled was {speedup:.2f}x eager here before (cached), no trial")
            self.state = "compiled"
            self._keep(step, "compiled", cached["compiled_ms"], self.cached_source)
            return
        self._compile(step + 1, why=why)
        if self.state == "compiled":  # no trial (CUDA): compiled is the decision
            self._keep(step, "compiled", None)

    def _trial_too_dear(self, left: float) -> bool:
        """Tell whether a trial would cost more than ``max_trial_share`` of the ``left`` eager
        seconds, for CPU auto with nothing measured before. Then it stays eager, and says so.
        The estimate and ``left`` come from the model and the eager step time, so a run that
        recalls the step time decides as the run that measured it did."""
        share = self.cfg.max_trial_share
        cost = compile_estimate_s(self.model) + 2 * self.cfg.trial_steps * self.eager_step  # trial steps run twice
        if not share or cost <= share * left:
            return False
        self.state = "off"
        if self.dist.is_main:
            logger.info(
                f"jit=auto stays eager: a compile trial costs ~{cost:.0f} s here, more than "
                f"jit.max_trial_share={share:g} of the {left:.0f} s left (compiling pays off in longer runs)"
            )
        return True

    def _compile(self, at_step: int, why: str) -> None:
        # the CPU build's C++ toolchain probe warns about a missing CUDA runtime: not ours to show
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        self.compiled = torch.compile(self.model, mode=self.cfg.mode, backend=self.cfg.backend, dynamic=False)
        self.compiled_at = at_step
        trial = self.cfg.name == "auto" and self.dist.device.type == "cpu"
        self.state = "trial" if trial else "compiled"
        if self.dist.is_main:
            when = f"from step {at_step}" if at_step >= 0 else "again"  # -1: on resume
            logger.info(f"{why}; compiling {when} (torch.compile {self.cfg.backend}, mode {self.cfg.mode})")

    def _judge(self) -> None:
        """Keep compiled, under CPU auto, only if it is faster than eager by ``min_speedup``. A
        speed-up within the noise of a few timed steps is not worth a compiled graph's recompiles."""
        compiled = all_reduce_max([statistics.median(self.compiled_times)], self.dist)[0]
        speedup = self.eager_step / compiled
        faster = speedup >= self.cfg.min_speedup
        self.state = "compiled" if faster else "off"
        self._keep(self._step, "compiled" if faster else "eager", compiled * 1000)
        if self.dist.is_main:
            verdict = "keeps compiled" if faster else "goes back to eager"
            short = "" if faster or speedup < 1 else f", less than jit.min_speedup={self.cfg.min_speedup:g}"
            logger.info(
                f"jit=auto {verdict}: {compiled * 1000:.0f} ms/step compiled vs {self.eager_step * 1000:.0f} ms eager "
                f"({speedup:.2f}x{short})"
            )

    def recover(self, exc: BaseException) -> bool:
        """Handle an exception in a step. If compiled code ran in it, go eager for good and return
        True, so that the step is redone. Otherwise the exception is not ours: return False."""
        if not self.used_compiled or self.state == "off":
            return False
        self.used_compiled, self.step_sigs, self.state = False, [], "off"
        cause = " ".join(str(exc).split())[:300] or type(exc).__name__
        if self.dist.is_main:
            logger.info(f"jit: compiling failed ({type(exc).__name__}: {cause}); running eager from here")
        return True

    @property
    def timing(self) -> bool:
        """Tell whether step times feed a decision now. A CUDA step is then synchronized to be timed."""
        return self.state in ("eager", "trial") and self.cfg.name == "auto"

    @property
    def trying(self) -> bool:
        """Tell whether this step is a compiled trial step, redone as decided (``fwk/components/trials.py``)."""
        return self.state == "trial"

    def rewind(self, before: dict[str, Any]) -> None:
        """Forget this step's calls, since the steps since ``before`` are redone. What was decided
        holds, compiled or eager."""
        self.step_sigs, self.used_compiled = [], False

    def summary(self) -> dict[str, Any]:
        return {"jit": self.state if self.cfg.name != "off" else "off"}

    def state_dict(self) -> dict[str, Any]:
        """Return auto's decision so far, so that a resumed run keeps it rather than deciding anew
        from its own step times. Compiled and eager steps differ in the last bits."""
        return {"state": self.state, "eager_step": getattr(self, "eager_step", 0.0), "decision": self.record}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.cfg.name != "auto" or self.state == "off":  # nothing to decide, or decided here (deterministic)
            return
        decided = state.get("state", "eager")
        if state.get("decision") is not None:
            self.record = state["decision"]
            if self.decisions is not None:
                self.decisions.keep("jit", self.record, "checkpoint")
        if decided == "off":
            self.state = "off"
            if self.dist.is_main:
                logger.info("jit=auto stays eager, as it decided before the checkpoint")
        elif decided in ("trial", "compiled"):
            self.eager_step = float(state.get("eager_step", 0.0))
            self._compile(-1, why="jit=auto compiled before the checkpoint")
            self.state = decided  # a trial goes on timing compiled steps; a kept decision stays


def _short(sig: Signature) -> str:
    shapes = ", ".join("x".join(map(str, s[0])) for s in sig[0])
    enabled, dtype = sig[3]
    autocast = f", autocast {str(dtype).removeprefix('torch.')}" if enabled else ""
    return f"({shapes}{'' if sig[1] else ', eval'}{autocast})"
