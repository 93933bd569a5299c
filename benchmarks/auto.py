"""fwk with its ``auto`` settings against the plain fp32 eager loop: training throughput.

For ResNet-50 on synthetic images (64 px) and the gpt_stdlib GPT: fwk's TrainStep with
precision, memory, jit and kernels all ``auto``, built as the trainer builds them for the
recipe's run length (auto's decisions depend on it), stepped until every auto has decided
(precision's range probe, memory's trials, the JIT's compile-and-compare), then timed
against the plain loop's fp32 eager step on the same batch, interleaved. Ratio: fwk auto
samples/s over plain samples/s. Target on a GPU: >= 1.7x; on a CPU the figure
is reported (fp32 is auto's choice there without AMX/AVX512-BF16, so ~1x is expected).
"""

from __future__ import annotations

import time

import torch

from benchmarks.common import batch_for, config, engine_step
from benchmarks.harness import Side, guarded, measure_pair, ratio_row
from benchmarks.overhead import k_steps, plain_step
from fwk.log import collected


def one(workload: str, quick: bool) -> list:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if workload == "resnet50":
        batch, size = (4, 32) if quick else (16, 64)
    else:
        batch, size = (4, 0) if quick else (32, 0)
    autos = ["precision=auto", "memory=auto", "jit=auto", "kernels=auto", f"train.device={device.type}"]
    extra = [*autos, *(["data.seq_len=32"] if quick and workload == "gpt" else [])]
    cfg = config(workload, batch, size, extra)
    with collected() as said:
        fwk, precision, memory, jit, _ = engine_step(cfg, device, batch, jit=True)
    x, y = batch_for(cfg, batch, device)
    plain_cfg = config(workload, batch, size, ["precision=fp32", "jit=off", "memory=none", "kernels=torch", *extra[5:]])
    plain = plain_step(plain_cfg, device)
    i, t0 = 0, time.perf_counter()
    cap_steps, cap_s = (12, 60) if quick else (60, 150)
    with collected() as later:
        while (jit.timing or not precision.probe_done or memory.measuring) and i < cap_steps:
            fwk(i, [(x, y)])
            i += 1
            if time.perf_counter() - t0 > cap_s:
                break
    said += later
    settled = not (jit.timing or not precision.probe_done or memory.measuring)
    k, reps = (1, 3) if quick else (3, 5)
    fwk_k, plain_k = k_steps(fwk, plain, x, y, k, start=i)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn):
        def run() -> None:
            fn()
            sync()  # the step's kernels are done before its time is taken

        return run

    pair = measure_pair(timed(fwk_k), timed(plain_k), reps, warmup=1)
    rate = lambda ts: batch * k / sorted(ts)[len(ts) // 2]  # noqa: E731
    chose = f"precision {precision.format}, jit {jit.state}, memory {memory.summary().get('memory', '?')}"
    verdict = next((m for m in said if m.startswith("jit=auto")), "")
    size_text = f"{size} px" if workload == "resnet50" else f"seq {cfg.data.seq_len}"
    notes = f"auto chose: {chose}; settled after {i} steps" + ("" if settled else " (NOT settled: capped)")
    notes += f"; {verdict}" if verdict else ""
    return [
        ratio_row(
            "auto",
            f"{workload} ({size_text}, batch {batch}) auto vs plain fp32 eager",
            pair.ratios(invert=True),
            Side("fwk auto", rate(pair.a), "samples/s"),
            Side("plain", rate(pair.b), "samples/s"),
            "fwk auto/plain samples/s",
            ">= 1.7x" if device.type == "cuda" else "",
            notes + ("" if device.type == "cuda" else "; the >= 1.7x target is for a GPU: CPU figure reported"),
        )
    ]


def rows(quick: bool) -> list:
    # the GPT first: ResNet-50 compiles for ~50 s (jit=auto), the likelier to overrun the budget
    return [r for w in ("gpt", "resnet50") for r in guarded("auto", w, lambda w=w: one(w, quick))]
