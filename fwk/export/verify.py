"""Stage 5: measure every stage on the validation set, and time the deployable ones.

Quality: one pass over the validation batches runs every model on the same batch, so
nothing is stored. It measures accuracy for classification or loss per token for lm, top-1
agreement with torch fp32, and the largest absolute difference of the outputs from torch fp32.

Latency: torch eager fp32 and each ONNX model in onnxruntime, at batch 1 and batch N,
with the same fixed number of intra-op threads for all. Timing runs in rounds: each
round runs every model several times in a row, after one untimed call, so load from
other processes on the machine falls on all models alike. p50/p90 are over all timed
calls.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from fwk.export.to_onnx import INPUT, OUTPUT

Runner = Callable[[np.ndarray], np.ndarray]


def torch_runner(model: nn.Module) -> Runner:
    model.eval()

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(x)).float().numpy()

    return run


def ort_session(path: Path, threads: int):  # -> onnxruntime.InferenceSession
    """Open a fresh onnxruntime session on the CPU with ``threads`` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: no per-session warnings on the terminal
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_runner(path: Path, threads: int) -> Runner:
    session = ort_session(path, threads)

    def run(x: np.ndarray) -> np.ndarray:
        return session.run([OUTPUT], {INPUT: x})[0]

    return run


def default_threads() -> int:
    """Return the number of cores this process may run on, from its affinity mask, not the
    machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_int8_features() -> dict[str, bool | str]:
    """Return what decides int8 speed on this CPU: VNNI (int8 dot products), AVX512, AMX."""
    flag = lambda name: bool(getattr(torch.cpu, f"_is_{name}_supported", lambda: False)())  # noqa: E731
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "vnni": flag("vnni"),
        "avx512": flag("avx512"),
        "amx": flag("amx_tile"),
    }


def batches(data: Dataset, batch_size: int, limit: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (x, y) numpy batches in the data set's order, at most ``limit`` of them. A
    ``limit`` of 0 means all."""
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False)
    for i, (x, y) in enumerate(loader):
        if limit and i >= limit:
            return
        yield x.numpy(), y.numpy()


@dataclass
class Quality:
    metric: float  # accuracy in [0, 1] (classification) or mean loss per target in nats (lm)
    loss: float
    agreement: float  # share of top-1 predictions equal to torch fp32's
    max_abs_diff: float  # largest |output - torch fp32 output|
    rel_diff: float  # max_abs_diff / largest |torch fp32 output|
    samples: int


class _Tally:
    def __init__(self) -> None:
        self.loss = self.correct = self.agree = 0.0
        self.count = 0
        self.max_diff = 0.0

    def add(self, logits: np.ndarray, target: np.ndarray, ref: np.ndarray) -> None:
        flat = logits.reshape(-1, logits.shape[-1]).astype(np.float64)  # (N, classes): images or tokens
        y = target.reshape(-1)
        shifted = flat - flat.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        self.loss += float(-log_probs[np.arange(len(y)), y].sum())
        top1 = flat.argmax(axis=1)
        self.correct += float((top1 == y).sum())
        self.agree += float((top1 == ref.reshape(-1, ref.shape[-1]).argmax(axis=1)).sum())
        self.count += len(y)
        self.max_diff = max(self.max_diff, float(np.abs(logits.astype(np.float64) - ref).max()))


def quality(
    runners: dict[str, Runner],
    reference: str,
    data: Iterator[tuple[np.ndarray, np.ndarray]],
    task: str,
) -> dict[str, Quality]:
    """Run every runner on every batch, and measure differences and agreement against
    ``runners[reference]``."""
    tallies = {name: _Tally() for name in runners}
    ref_max, samples = 0.0, 0
    for x, y in data:
        ref = runners[reference](x).astype(np.float64)
        ref_max = max(ref_max, float(np.abs(ref).max()))
        samples += len(x)
        for name, run in runners.items():
            tallies[name].add(ref if name == reference else run(x), y, ref)
    out = {}
    for name, t in tallies.items():
        n = max(t.count, 1)
        loss = t.loss / n
        out[name] = Quality(
            metric=loss if task == "lm" else t.correct / n,
            loss=loss,
            agreement=t.agree / n,
            max_abs_diff=t.max_diff,
            rel_diff=t.max_diff / max(ref_max, 1e-12),
            samples=samples,
        )
    return out


@dataclass
class Latency:
    p50_ms: float
    p90_ms: float
    min_ms: float
    max_ms: float
    round_p50_ms: tuple[float, ...] = ()  # each interleaved round's median: its spread across rounds


def _percentile(times: list[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def latency(
    runners: dict[str, Runner],
    inputs: dict[int, np.ndarray],
    threads: int,
    warmup: int,
    iterations: int,
    rounds: int = 4,
) -> dict[str, dict[int, Latency]]:
    """Time every runner at each batch size, as {runner: {batch size: Latency}}. Meanwhile
    torch runs with ``threads`` intra-op threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    rounds = max(1, min(rounds, iterations))
    try:
        out: dict[str, dict[int, Latency]] = {name: {} for name in runners}
        for batch, x in inputs.items():
            for run in runners.values():
                for _ in range(warmup):
                    run(x)
            times: dict[str, list[float]] = {name: [] for name in runners}
            medians: dict[str, list[float]] = {name: [] for name in runners}
            for r in range(rounds):
                per_round = iterations // rounds + (1 if r < iterations % rounds else 0)
                for name, run in runners.items():
                    run(x)  # untimed: the caches after the previous model's round
                    for _ in range(per_round):
                        t0 = time.perf_counter()
                        run(x)
                        times[name].append((time.perf_counter() - t0) * 1e3)
                    medians[name].append(_percentile(times[name][-per_round:], 0.5))
            for name, ts in times.items():
                p50, p90 = _percentile(ts, 0.5), _percentile(ts, 0.9)
                out[name][batch] = Latency(p50, p90, min(ts), max(ts), tuple(medians[name]))
        return out
    finally:
        torch.set_num_threads(previous)


def latency_inputs(val: Dataset, batch_n: int) -> dict[int, np.ndarray]:
    """Pick real validation samples at batch 1 and batch N, cycled when the set is smaller."""
    xs = [val[i % len(val)][0] for i in range(max(batch_n, 1))]
    full = torch.stack(xs).numpy()
    return {1: full[:1], batch_n: full} if batch_n > 1 else {1: full[:1]}
