"""Run the recipe's real training step under ``torch.profiler`` and write its trace.

The engine trains as ``fwk train`` would (its precision, memory, parallel and jit
strategies) for ``warmup + steps`` optimizer steps; the profiler steps after each one, and
only the last ``steps`` are recorded. The training happens in a throwaway
run dir: the run that ``fwk train`` would make for the same overrides gets nothing but its
``profile/`` folder, so it is never mistaken for a half-trained run.

Module names come from forward hooks on the freshly built model (``fresh_model``): each module's
forward is a ``fwk.module: <name>`` profiler range; backward ops are matched to them by
autograd's sequence numbers when the trace is read (``figures.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fwk.config.schema import Config, one_process
from fwk.errors import UserError

logger = logging.getLogger(__name__)

MODULE_PREFIX = "fwk.module: "
ROOT = "<model>"  # the name of the whole model in the module table (named_modules() calls it "")


@dataclass
class Captured:
    """What the profiled run leaves for the report: the trace and the facts beside it."""

    trace: Path
    steps: int
    modules: dict[str, str]  # qualified module name -> class name
    device: str  # "cpu" or "cuda"
    hardware: dict[str, Any]  # bf16_fast, text, memory_bytes
    notes: list[str] = field(default_factory=list)
    startup: dict[str, float] = field(default_factory=dict)  # this process's start-up phases, in seconds
    startup_memory: dict[str, float] = field(default_factory=dict)  # the resident MiB each phase added


class ModuleLabels:
    """A hook set that opens a ``fwk.module: <name>`` profiler range around every module's forward."""

    def __init__(self) -> None:
        self.types: dict[str, str] = {}

    def attach(self, model: nn.Module) -> nn.Module:
        """Install the hooks, and return the model to train."""
        from torch.profiler import record_function

        for qualified, module in model.named_modules():
            name = qualified or ROOT
            self.types[name] = type(module).__name__
            open_ranges: list[Any] = []

            def enter(mod: nn.Module, args: Any, label: str = MODULE_PREFIX + name, stack: list = open_ranges) -> None:
                if torch.compiler.is_compiling():  # inside a compiled graph the ranges are not ours to open
                    return
                rf = record_function(label)
                rf.__enter__()
                stack.append(rf)

            def leave(mod: nn.Module, args: Any, out: Any, stack: list = open_ranges) -> None:
                if stack and not torch.compiler.is_compiling():
                    stack.pop().__exit__(None, None, None)

            module.register_forward_pre_hook(enter)
            module.register_forward_hook(leave, always_call=True)  # closed even when forward raises (OOM retry)
        return model


class EngineOutput(io.TextIOBase):
    """The engine's stdout while profiling. Every line goes into ``engine.log``.

    On screen it shows the engine's decisions (precision, memory, parallel, jit) but not its
    progress rows, whose loss and accuracy after a few steps mean nothing here."""

    _PROGRESS = re.compile(r"^step\s+\d+/\d+\s")

    def __init__(self, log: Path) -> None:
        self._log = open(log, "w", encoding="utf-8")
        self._screen = sys.stdout
        self._line = ""

    def write(self, text: str) -> int:
        self._log.write(text)
        self._line += text
        *lines, self._line = self._line.split("\n")
        for line in lines:
            if not self._PROGRESS.match(line):
                self._screen.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._log.flush()
        self._screen.flush()

    def close(self) -> None:
        if self._line and not self._PROGRESS.match(self._line):
            self._screen.write(self._line)
        self._line = ""
        super().close()  # flushes first
        self._log.close()


def profile_config(cfg: Config, warmup: int, steps: int) -> tuple[Config, list[str]]:
    """Cut the run's config to ``warmup + steps`` steps in one process, without evaluation or
    checkpoints to speak of. Return it with notes on what differs from the real run."""
    replace = dataclasses.replace
    total = warmup + steps
    notes = []
    parallel = cfg.parallel
    if cfg.world_size > 1:
        notes.append(
            f"profiled in one process (the run has {cfg.world_size}): communication between processes "
            "is not measured here"
        )
        parallel = one_process(parallel)
    precision = cfg.precision
    if precision.name == "auto" and precision.probe_steps > warmup:
        # the range probe (hooks on every module) runs in the first probe_steps: keep it out of the record
        precision = replace(precision, probe_steps=warmup)
    if cfg.jit.name == "auto":
        notes.append(
            f"jit=auto stays eager in a profile this short: it compiles only when the steps left take longer "
            f"than jit.min_remaining_s={cfg.jit.min_remaining_s:g} s; profile jit=compile to see compiled steps"
        )
    short = replace(
        cfg,
        train=replace(cfg.train, max_steps=total, eval_every=0, eval_batches=1, log_every=total),
        schedule=replace(cfg.schedule, warmup_steps=min(cfg.schedule.warmup_steps, total - 1)),
        checkpoint=replace(cfg.checkpoint, every=0, keep=1, rewind_at=0.0),
        parallel=parallel,
        precision=precision,
        auto=replace(cfg.auto, cache=False),  # steps timed under the profiler must not decide later runs
    )
    return short, notes


def _hardware(device: torch.device) -> dict[str, Any]:
    import os

    from fwk.strategies import hardware

    features = hardware.probe(device)
    if device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"bf16_fast": features.bf16_fast, "text": features.text, "memory_bytes": int(memory)}


def capture(cfg: Config, warmup: int, steps: int, out: Path) -> Captured:
    """Train ``warmup + steps`` steps of ``cfg`` under the profiler. The trace goes to ``out``."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from fwk.distributed.group import pick_device
    from fwk.engine import trainer
    from fwk.engine.assemble import build_run, fresh_model
    from fwk.track import startup
    from fwk.track.store import RunDir

    short, notes = profile_config(cfg, warmup, steps)
    device = pick_device(short.train.device, 0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    trace = out / "trace.json"
    labels = ModuleLabels()
    prof = profile(
        activities=activities,
        # step 0 (from here to the first optimizer step) builds the engine: it is a warm-up step
        schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
        record_shapes=True,
        profile_memory=True,
    )
    logger.info(f"profiling {steps} steps after {warmup} warm-up steps on {device.type}")
    with (
        tempfile.TemporaryDirectory(prefix="fwk-profile-") as tmp,
        EngineOutput(out / "engine.log") as engine,
        contextlib.redirect_stdout(engine),
        prof,
    ):
        startup.mark("profiler")  # the engine's modules and the profiler's start
        run = build_run(short, RunDir(Path(tmp)), model=labels.attach(fresh_model(short)))
        for _ in trainer.steps(run):
            if device.type == "cuda":  # the step's queued kernels first: each recorded step holds its own work
                torch.cuda.synchronize(device)
            prof.step()
        summary = trainer.finish(run) if run.progress.finished else None
    if summary is None:
        raise UserError("fwk profile was interrupted; run the same command again")
    if not trace.exists():
        raise UserError(f"the profiler wrote no trace to {trace}")
    startup = {"seconds": summary.get("startup") or {}, "memory": summary.get("startup_memory_mib") or {}}
    return Captured(
        trace, steps, labels.types, device.type, _hardware(device), notes, startup["seconds"], startup["memory"]
    )
