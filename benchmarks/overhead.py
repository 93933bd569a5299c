"""What fwk's engine costs over a plain PyTorch loop, as ratios measured side by side.

- step: fwk's TrainStep, built as the trainer builds it (precision fp32, jit off, the
  recipe's kernels and memory), against the plain loop's step (forward, cross-entropy,
  backward, optimizer step, zero_grad) on the same model init, optimizer and real batch,
  for digits_cnn, resnet_digits and gpt_stdlib; a rep is ``k`` steps of each side.
- command: the whole ``fwk train`` (digits_cnn, N steps, into a fresh runs root) against
  benchmarks/plain_train.py (the same training, ~40 lines) as processes, end to end.

- fixed cost: the same two steps on a digits_cnn one channel wide at batch 1, where a step is
  mostly dispatch: fwk's cost per step whatever the model, against the 1% bound of a digits step.

Targets: step <= 1.02x, whole command <= 1.10x (fwk time / plain time).
Run by benchmarks/harness.py (``make bench``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from benchmarks.common import engine_step
from benchmarks.harness import Side, guarded, measure_pair, ratio_row
from fwk.config.compose import compose
from fwk.config.validate import to_typed
from fwk.data.build import build_data
from fwk.models import MODELS
from fwk.optim import build_optimizer

WORKLOADS = {  # name -> overrides at full size, at --quick size
    "digits_cnn": (["recipe=digits_cnn"], ["recipe=digits_cnn"]),
    # batch 16, not the recipe's 64: a step is ~0.4 s, not ~1.6 s, on 2 cores (and a smaller
    # batch shows the engine's fixed cost per step more, not less)
    "resnet_digits": (["recipe=resnet_digits", "train.batch_size=16"], ["recipe=resnet_digits", "train.batch_size=8"]),
    "gpt_stdlib": (["recipe=gpt_stdlib"], ["recipe=gpt_stdlib", "train.batch_size=4", "data.seq_len=32"]),
}


def workload(overrides: list[str]):
    """The typed config, a real training batch of it, and its data bundle."""
    cfg = to_typed(compose([*overrides, "precision=fp32", "jit=off", "train.device=cpu"]))
    data = build_data(cfg.data, seed=cfg.seed)
    loader = torch.utils.data.DataLoader(data.train, batch_size=cfg.train.batch_size, shuffle=False)
    return cfg, next(iter(loader)), data


def plain_step(cfg, device: torch.device = torch.device("cpu")):
    """The plain loop's model (same init as fwk's), optimizer and step function."""
    torch.manual_seed(cfg.seed)
    model = MODELS.get(cfg.model.name).builder(cfg.model).to(device).train()
    opt = build_optimizer(cfg.optim, model)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def k_steps(fwk, plain, x: torch.Tensor, y: torch.Tensor, k: int, start: int = 0):
    """Two functions running ``k`` steps of each side on the batch (x, y); fwk's from step ``start``."""
    i = [start]

    def fwk_k() -> None:
        for _ in range(k):
            fwk(i[0], [(x, y)])
            i[0] += 1

    def plain_k() -> None:
        for _ in range(k):
            plain(x, y)

    return fwk_k, plain_k


def steps_per_rep(plain, x: torch.Tensor, y: torch.Tensor, rep_s: float) -> int:
    """How many steps make a rep of about ``rep_s`` seconds, from two timed plain steps
    after one warm-up (a rep of many short steps smooths the timer; of one long step, the
    budget)."""
    plain(x, y)
    t0 = time.perf_counter()
    plain(x, y)
    plain(x, y)
    return max(1, round(rep_s / ((time.perf_counter() - t0) / 2)))


def step_rows(quick: bool) -> list:
    rows = []
    reps, rep_s = (3, 0.1) if quick else (15, 0.5)  # 15 reps: a digits step is ~8 ms, near the noise
    for name, (full, small) in WORKLOADS.items():
        cfg, (x, y), _ = workload(small if quick else full)
        fwk = engine_step(cfg, torch.device("cpu"), cfg.train.batch_size).step
        plain = plain_step(cfg)
        k = steps_per_rep(plain, x, y, rep_s)
        fwk_k, plain_k = k_steps(fwk, plain, x, y, k)
        pair = measure_pair(fwk_k, plain_k, reps=reps, warmup=1)
        ms = lambda ts, k=k: 1000 * sorted(ts)[len(ts) // 2] / k  # noqa: E731
        rows.append(
            ratio_row(
                "overhead",
                f"step {name} (batch {cfg.train.batch_size}, fp32, eager)",
                pair.ratios(),
                Side("fwk", ms(pair.a), "ms/step"),
                Side("plain", ms(pair.b), "ms/step"),
                "fwk/plain step time",
                "<= 1.02x",
                f"median of {reps} reps x {k} steps",
            )
        )
    return rows


TINY = ["model.channels1=1", "model.channels2=1", "model.hidden=2", "train.batch_size=1"]  # compute ~0


def fixed_rows(quick: bool) -> list:
    """fwk's fixed cost per step: its step against the plain one on a digits_cnn so narrow
    (one channel, batch 1) that a step is mostly dispatch, so the difference is what fwk's
    hooks cost whatever the model, shown against a digits_cnn step at the recipe's size."""
    reps, k = (5, 50) if quick else (31, 200)
    cfg, (x, y), _ = workload(["recipe=digits_cnn", *TINY])
    fwk = engine_step(cfg, torch.device("cpu"), 1).step
    unchecked = engine_step(cfg, torch.device("cpu"), 1).step
    unchecked.diagnostics = None  # what the NaN check and the rollback snapshots cost
    fwk_k, plain_k = k_steps(fwk, plain_step(cfg), x, y, k)
    unchecked_k, _ = k_steps(unchecked, plain_step(cfg), x, y, k)
    pair = measure_pair(fwk_k, plain_k, reps=reps, warmup=1)
    checks = measure_pair(fwk_k, unchecked_k, reps=reps, warmup=1)
    us = lambda ts: 1e6 * statistics.median(ts) / k  # noqa: E731
    full, (fx, fy), _ = workload(["recipe=digits_cnn"])
    digits = plain_step(full)
    digits(fx, fy)
    t0 = time.perf_counter()
    for _ in range(5):
        digits(fx, fy)
    step_us = 1e6 * (time.perf_counter() - t0) / 5
    cost = us(pair.a) - us(pair.b)
    return [
        ratio_row(
            "overhead",
            "fixed cost per step (digits_cnn 1 channel, batch 1)",
            pair.ratios(),
            Side("fwk", us(pair.a), "us/step"),
            Side("plain", us(pair.b), "us/step"),
            "fwk/plain step time",
            "",
            f"fwk - plain: {cost:+.0f} us a step, {100 * cost / step_us:.1f}% of a digits_cnn step "
            f"({step_us / 1000:.1f} ms at batch {full.train.batch_size}; bound 1%); of it the NaN check of the loss "
            f"and gradients (one copy to the host) and the rollback snapshots: {us(checks.a) - us(checks.b):+.0f} us "
            "(measured against fwk's step without them); the rest: the strategies' hooks and the step's "
            f"bookkeeping; median of {reps} reps x {k}",
        )
    ]


def _timed(argv: list[str], env: dict | None = None) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")


def command_rows(quick: bool) -> list:
    steps, reps = (20, 3) if quick else (100, 5)
    with tempfile.TemporaryDirectory(prefix="fwk-bench-cmd-") as tmp:
        n = [0]

        def fwk() -> None:  # a fresh runs root each time: the same command in the same root would resume
            n[0] += 1
            env = {**os.environ, "FWK_RUNS": f"{tmp}/runs{n[0]}"}
            _timed([sys.executable, "-m", "fwk", "train", f"train.max_steps={steps}", "train.eval_every=0"], env)

        def plain() -> None:
            _timed([sys.executable, "-m", "benchmarks.plain_train", f"--steps={steps}", f"--out={tmp}/plain.pt"])

        pair = measure_pair(fwk, plain, reps=reps, warmup=1)
    med = lambda ts: sorted(ts)[len(ts) // 2]  # noqa: E731
    return [
        ratio_row(
            "overhead",
            f"whole command, digits_cnn {steps} steps",
            pair.ratios(),
            Side("fwk train", med(pair.a), "s"),
            Side("plain_train.py", med(pair.b), "s"),
            "fwk/plain wall time",
            "<= 1.10x",
            "both as processes, end to end (imports, data, training, final eval, save); fwk train at its defaults",
        )
    ]


def rows(quick: bool) -> list:
    return (
        guarded("overhead", "step", lambda: step_rows(quick))
        + guarded("overhead", "fixed cost", lambda: fixed_rows(quick))
        + guarded("overhead", "whole command", lambda: command_rows(quick))
    )
