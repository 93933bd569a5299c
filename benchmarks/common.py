"""Shared by the benchmarks: build a workload through fwk's own config and engine objects,
and time steps side by side (interleaved rounds, medians), as the issue's method asks.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from fwk.components.diagnostics import Diagnostics
from fwk.components.reproduce import deterministic
from fwk.config.compose import compose
from fwk.config.schema import JitConfig
from fwk.config.validate import to_typed
from fwk.distributed.group import Dist
from fwk.engine.step import TrainStep
from fwk.models import MODELS
from fwk.models.loss import CrossEntropy
from fwk.optim import build_optimizer, build_schedule
from fwk.strategies.jit import Jit
from fwk.strategies.kernels import Kernels
from fwk.strategies.memory import Memory
from fwk.strategies.precision import Precision
from fwk.strategies.step_plan import StepPlan


def config(workload: str, batch: int, image_size: int, extra: list[str]):
    """The recipe's config at benchmark size: resnet50 on synthetic images, or a GPT."""
    if workload == "resnet50":
        base = ["recipe=resnet50_imagenet", "data=synthetic", f"data.image_size={image_size}"]
    elif workload == "gpt":
        base = ["recipe=gpt_stdlib"]
    elif workload == "gpt8":  # the recipe's GPT at 8 layers: memory is dominated by activations
        base = ["recipe=gpt_stdlib", "model.n_layer=8"]
    elif workload == "digits":  # the default recipe: the small CNN on 8x8 digits (image_size unused)
        base = ["recipe=digits_cnn"]
    else:
        raise SystemExit(f"unknown workload {workload}")
    return to_typed(compose([*base, f"train.batch_size={batch}", *extra]))


def batch_for(cfg, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if cfg.model.name == "gpt":
        t = cfg.data.seq_len
        x = torch.randint(0, cfg.model.vocab_size, (batch, t), generator=g)
        y = torch.randint(0, cfg.model.vocab_size, (batch, t), generator=g)
    else:
        s, c = cfg.data.image_size, getattr(cfg.model, "in_channels", 3)
        x = torch.randn(batch, c, s, s, generator=g)
        y = torch.randint(0, cfg.model.num_classes, (batch,), generator=g)
    return x.to(device), y.to(device)


class Engine(NamedTuple):
    step: TrainStep
    precision: Precision
    memory: Memory
    jit: Jit
    kernels: Kernels


def engine_step(cfg, device: torch.device, batch: int, jit: bool = False) -> Engine:
    """The same objects the trainer builds, in the same order, for one process. The JIT is
    off unless ``jit`` (the strategy benchmarks time eager steps; jit.py times compiling).
    The strategies' lines (what auto chose and why) go to fwk's logger (``fwk.log.collected``)."""
    d = Dist(rank=0, local_rank=0, world_size=1, device=device)
    deterministic(cfg.train.deterministic)  # as the trainer: cuDNN's autotuner unless deterministic
    torch.manual_seed(cfg.seed)
    precision = Precision(cfg.precision, d, cfg.train.max_steps)
    memory = Memory(cfg.memory, d, batch)
    compiler = Jit(cfg.jit if jit else JitConfig(name="off"), d, cfg.train.max_steps)
    kernels = Kernels(cfg.kernels, device)
    raw = MODELS.get(cfg.model.name).builder(cfg.model).to(device)
    raw = memory.apply(precision.prepare(kernels.apply(raw)))
    raw.train()
    optimizer = build_optimizer(cfg.optim, raw, fused=kernels.triton)
    scheduler = build_schedule(cfg.schedule, optimizer, cfg.train.max_steps)
    # the per-step NaN/spike checks and rollback snapshots, as in every run
    diagnostics = Diagnostics(cfg.diagnostics, d, raw, optimizer, scheduler, precision, cfg.train.log_every)
    loss = CrossEntropy(fused=kernels.fused_loss)
    strategies = [precision, memory, compiler]  # decisions.DECISION_ORDER
    plan = StepPlan(cfg.train.accum_steps, memory)
    step = TrainStep(compiler.wrap(raw), optimizer, strategies, plan, loss, cfg.train.grad_clip, d, diagnostics)
    return Engine(step, precision, memory, compiler, kernels)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_times(
    steps: dict[str, Callable[[], None]], rounds: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds of one call of each, per round, timed in round-robin order so drift hits all
    alike; the order turns round by round, so that no option always runs first, and runs
    backwards every other round, so that none always follows the same one (a fast fp32 step
    right after an emulated bf16 one finds its caches cold: 5% on the 7 ms digits step)."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order[::-1] if r % 2 else order:
            sync(device)
            t0 = time.perf_counter()
            steps[name]()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return times


def interleaved(steps: dict[str, Callable[[], None]], rounds: int, device: torch.device) -> dict[str, float]:
    """Median seconds of one call of each (``interleaved_times``)."""
    return {name: statistics.median(ts) for name, ts in interleaved_times(steps, rounds, device).items()}


def option_rows(group: str, what: str, times: dict[str, list[float]], base: str, note: str = "", targets=None):
    """One harness row per option: its per-round time ratio to ``base`` (median [min, max])."""
    from benchmarks.harness import Side, ratio_row

    rows = []
    for name, ts in times.items():
        if name == base:
            continue
        ratios = [t / b for t, b in zip(ts, times[base], strict=True)]
        rows.append(
            ratio_row(
                group,
                f"{what}: {name}",
                ratios,
                Side(name, 1000 * statistics.median(ts), "ms"),
                Side(base, 1000 * statistics.median(times[base]), "ms"),
                f"{name}/{base} step time",
                (targets or {}).get(name, ""),
                note,
            )
        )
    return rows


def device_arg(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    from fwk.strategies.hardware import probe

    return f"{probe(device).text}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def arguments(gpt_batch: int, workloads: str) -> argparse.ArgumentParser:
    """The options both benchmarks take; defaults fit a 2-core CPU (see each script for GPU sizes)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timed steps per option (median)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    parser.add_argument("--image-size", type=int, default=64, help="ResNet-50 input side in pixels")
    parser.add_argument("--batch", type=int, default=16, help="ResNet-50 batch")
    parser.add_argument("--gpt-batch", type=int, default=gpt_batch, help="GPT batch")
    parser.add_argument("--workloads", default=workloads)
    return parser


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_during(fn) -> int:
    """The largest resident set size while fn runs, polled every 0.5 ms by a thread
    (torch's kernels release the GIL, so the thread samples during them)."""
    peak, done = [rss()], threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.0005)

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(peak[0], rss())
