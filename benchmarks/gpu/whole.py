"""The whole ``fwk train`` command against the plain PyTorch loop a user would write, as
processes, end to end (imports, data, training, evaluation, checkpoint): a wall-time ratio.
One part of ``make gpu-check``.

    python -m benchmarks.gpu.whole {resnet50,gpt} [--dry] [--reps 2] [--warmup 0]

- resnet50: ``fwk train recipe=resnet50_imagenet data=synthetic train.max_steps=100``, every
  auto at its default (precision, memory, jit, kernels, loader), against
  benchmarks/gpu/plain_amp.py's ResNet-50 loop: torchvision's ResNet-50, the same synthetic
  images and batch, SGD + Nesterov, schedule and label smoothing, bf16 autocast,
  channels_last, cudnn.benchmark, loader workers with pinned memory.
- gpt: ``fwk train recipe=gpt_stdlib train.max_steps=300`` (300 of the recipe's 900 steps,
  to keep the part near a minute on one GPU) against plain_amp.py's GPT loop: fwk's GPT
  class, the standard library's bytes, AdamW, schedule, gradient clipping, bf16 autocast.

Every plain value comes from the fwk command's own composed config, so the two sides train
the same thing; a recipe that moves outside what the plain loop implements (another
optimizer, schedule or data set) fails with one line. Each rep runs both sides as
subprocesses, alternating which goes first; each fwk run gets a fresh runs root
(``FWK_RUNS``) and an empty fwk cache (``XDG_CACHE_HOME`` in a temporary folder), so its
autos measure as in a first run on the machine, the same in every rep, and the user's
~/.cache/fwk is neither read nor changed. The ratio is fwk seconds / plain seconds per rep,
reported as median [min, max]. ``--warmup N`` runs each side N times untimed first (default
0: in ``make gpu-check`` the parts before have warmed the page cache and the driver).

``--dry``: the same on the CPU at tiny sizes (32 px images, batch 2, 3 steps, 8 val images;
a 1-layer GPT on 64 KiB of text, 5 steps), the plain side in fp32, so the part runs where
there is no GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.config.compose import compose
from fwk.config.schema import Config
from fwk.config.validate import to_typed

ROOT = Path(__file__).resolve().parents[2]
PLAIN = "benchmarks.gpu.plain_amp"  # the plain side, as ``python -m``
TIMEOUT_S = 600  # one process, either side: a hang ends as a FAILED line, not a stuck check


class Failed(Exception):
    """What to print after ``FAILED:``, in one line."""


def flag(name: str, on: bool) -> str:
    return f"--{name}" if on else f"--no-{name}"


def common_args(cfg: Config, cuda: bool) -> list[str]:
    t, s, o = cfg.train, cfg.schedule, cfg.optim
    return [
        f"--device={'cuda' if cuda else 'cpu'}",
        f"--amp={'bf16' if cuda else 'off'}",
        f"--steps={t.max_steps}",
        f"--batch-size={t.batch_size}",
        f"--seed={cfg.seed}",
        f"--lr={o.lr}",
        f"--weight-decay={o.weight_decay}",
        f"--warmup-steps={s.warmup_steps}",
        f"--min-lr-ratio={s.min_lr_ratio}",
        f"--label-smoothing={cfg.method.label_smoothing.smoothing if 'label_smoothing' in cfg.methods else 0.0}",
        f"--grad-clip={t.grad_clip}",
        f"--eval-every={t.eval_every}",
        f"--log-every={t.log_every}",
    ]


def resnet50_args(cfg: Config, cuda: bool) -> list[str]:
    m, d, o = cfg.model, cfg.data, cfg.optim
    return [
        "resnet50",
        *common_args(cfg, cuda),
        f"--image-size={d.image_size}",
        f"--num-classes={m.num_classes}",
        f"--num-train={d.num_train}",
        f"--num-val={d.num_val}",
        f"--momentum={o.momentum}",
        flag("nesterov", o.nesterov and o.momentum > 0),  # as fwk's sgd: Nesterov needs momentum
        flag("zero-init-residual", m.zero_init_residual),
        flag("channels-last", cuda),  # NVIDIA's guide: NHWC under AMP; fp32 on the CPU stays NCHW
    ]


def gpt_args(cfg: Config, cuda: bool) -> list[str]:
    m, d, o = cfg.model, cfg.data, cfg.optim
    return [
        "gpt",
        *common_args(cfg, cuda),
        f"--vocab-size={m.vocab_size}",
        f"--block-size={m.block_size}",
        f"--n-layer={m.n_layer}",
        f"--n-head={m.n_head}",
        f"--n-embd={m.n_embd}",
        f"--dropout={m.dropout}",
        flag("bias", m.bias),
        f"--seq-len={d.seq_len}",
        f"--val-every={d.val_every}",
        f"--max-bytes={d.max_bytes}",
        f"--val-max-bytes={d.val_max_bytes}",
        f"--beta1={o.beta1}",
        f"--beta2={o.beta2}",
        f"--eps={o.eps}",
    ]


@dataclass(frozen=True)
class Workload:
    overrides: tuple[str, ...]  # the fwk train command on a GPU
    dry: tuple[str, ...]  # added with --dry (with train.device=cpu): tiny sizes
    names: tuple[str, str, str]  # the model, data set and optimizer the plain loop implements
    plain_args: Callable[[Config, bool], list[str]]  # the same training as plain_amp.py's arguments
    shape: Callable[[Config], str]  # what a batch is, for the report


WORKLOADS = {
    "resnet50": Workload(
        ("recipe=resnet50_imagenet", "data=synthetic", "train.max_steps=100"),
        ("data.image_size=32", "train.batch_size=2", "train.max_steps=3", "data.num_val=8"),
        ("resnet50", "synthetic", "sgd"),
        resnet50_args,
        lambda cfg: f"{cfg.data.image_size} px synthetic images, {cfg.data.num_val} val images",
    ),
    "gpt": Workload(
        ("recipe=gpt_stdlib", "train.max_steps=300"),
        ("model.n_layer=1", "model.n_embd=32", "model.n_head=2", "data.seq_len=32", "train.batch_size=4",
         "train.max_steps=5", "data.max_bytes=65536", "data.val_max_bytes=2048"),
        ("gpt", "stdlib_text", "adamw"),
        gpt_args,
        lambda cfg: f"seq_len {cfg.data.seq_len}, GPT n_layer {cfg.model.n_layer}, n_embd {cfg.model.n_embd}",
    ),
}  # fmt: skip


def check_plain_covers(cfg: Config, names: tuple[str, str, str]) -> None:
    """The composed config is one the plain loop trains the same way; else one line saying what differs."""
    model, data, optim = names
    rules = [
        ("model", cfg.model.name, model),
        ("data", cfg.data.name, data),
        ("optim", cfg.optim.name, optim),
        ("schedule.decay", cfg.schedule.decay, "cosine"),
        ("train.accum_steps", cfg.train.accum_steps, 1),
        ("train.eval_batches", cfg.train.eval_batches, 0),
        ("methods", [m for m in cfg.methods if m != "label_smoothing"], []),  # it smooths (--label-smoothing)
        ("parallel.nproc_per_node x parallel.nnodes", cfg.parallel.nproc_per_node * cfg.parallel.nnodes, 1),
    ]
    for key, got, want in rules:
        if got != want:
            raise Failed(f"{key}={got} but benchmarks/gpu/plain_amp.py implements only {key}={want}")


def timed(side: str, argv: list[str], env: dict[str, str]) -> tuple[float, str, str]:
    """(wall seconds, stdout, stderr) of one process; Failed with its last stderr lines if it fails."""
    t0 = time.perf_counter()
    with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.terminate()  # fwk's launcher passes SIGTERM on to its workers and waits for them
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            raise Failed(f"{side} side: still running after {TIMEOUT_S} s, stopped") from None
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = [line.strip() for line in (err.strip() or out.strip()).splitlines()[-3:]]
        raise Failed(f"{side} side (exit {proc.returncode}): {' | '.join(tail)[-400:]}")
    return seconds, out, err


def dig(record: Any, *keys: str) -> Any:
    for key in keys:
        record = record.get(key) if isinstance(record, dict) else None
    return "?" if record is None else record


@dataclass
class Rep:
    first: str
    fwk_s: float
    summary: dict  # the fwk run's summary.json, and "loader_workers" from its log
    plain_s: float
    result: dict  # the plain loop's JSON line

    @property
    def ratio(self) -> float:
        return self.fwk_s / self.plain_s

    def row(self) -> str:
        s = self.summary
        chose = f"{s.get('precision', '?')}, {s.get('memory', '?')}, {s.get('jit', '?')}, "
        chose += f"{s['loader_workers']} workers"
        val_loss = dig(s, "eval", "val_loss")
        losses = f"{val_loss:.4f}" if isinstance(val_loss, float) else val_loss
        losses += f" / {self.result['val_loss']:.4f}"
        return f"| {self.first} | {self.fwk_s:.1f} | {self.plain_s:.1f} | {self.ratio:.3f} | {chose} | {losses} |"


def measure(workload: str, dry: bool, reps: int, warmup: int) -> list[Rep]:
    work = WORKLOADS[workload]
    added = (*work.dry, "train.device=cpu") if dry else ()
    overrides = list({o.split("=", 1)[0]: o for o in (*work.overrides, *added)}.values())  # a later key= wins
    cfg = to_typed(compose(overrides))
    check_plain_covers(cfg, work.names)
    if not dry:
        import torch

        if not torch.cuda.is_available():
            raise Failed("no CUDA device here; whole.py measures on a GPU (--dry runs it on the CPU at tiny sizes)")
    fwk_argv = [sys.executable, "-m", "fwk", "train", *overrides]
    plain_argv = [sys.executable, "-m", PLAIN, *work.plain_args(cfg, not dry)]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    print(f"## whole {workload} ({'cpu, --dry' if dry else 'cuda'}): fwk train vs plain_amp.py, as processes\n")
    print(f"- fwk: `python -m fwk train {' '.join(overrides)}` (fresh runs root and fwk cache each run)")
    print(f"- plain: `python -m {PLAIN} {' '.join(plain_argv[3:])}`")
    print(f"- steps {cfg.train.max_steps}, batch {cfg.train.batch_size}, {work.shape(cfg)}")
    with tempfile.TemporaryDirectory(prefix="fwk-gpu-whole-") as tmp:
        runs = itertools.count()

        def fwk() -> tuple[float, dict]:
            n = next(runs)
            root = Path(tmp) / f"runs{n}"
            seconds, *log = timed("fwk", fwk_argv, {**env, "FWK_RUNS": str(root), "XDG_CACHE_HOME": f"{tmp}/cache{n}"})
            found = list(root.glob("*/summary.json"))
            if len(found) != 1:
                raise Failed(f"fwk side: {len(found)} summary.json files under its runs root, expected 1")
            summary = json.loads(found[0].read_text())
            # the loader's line; summary.json records only a measured choice (none for in-memory data)
            said = re.search(r"^loader=\w+: (\d+) workers?", "\n".join(log), re.MULTILINE)
            summary["loader_workers"] = said[1] if said else dig(summary, "decisions", "loader", "choice")
            shutil.rmtree(root)  # its checkpoints: ~0.3 GB a run for ResNet-50
            return seconds, summary

        def plain() -> tuple[float, dict]:
            out = f"{tmp}/plain{next(runs)}.pt"
            seconds, stdout, _ = timed("plain", [*plain_argv, f"--out={out}"], env)
            os.remove(out)
            try:
                return seconds, json.loads(stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                raise Failed(f"plain side: its last line is not its JSON result: {stdout.strip()[-200:]!r}") from None

        for _ in range(warmup):
            fwk()
            plain()
        done = []
        for rep in range(reps):
            order = ("fwk", "plain") if rep % 2 == 0 else ("plain", "fwk")
            got = {name: (fwk if name == "fwk" else plain)() for name in order}
            done.append(Rep(order[0], *got["fwk"], *got["plain"]))
    return done


def report(workload: str, done: list[Rep]) -> None:
    plain = done[-1].result
    layout = ", channels_last" if plain.get("channels_last") else ""
    amp = "bf16 autocast" if plain["amp"] == "bf16" else "fp32"
    print(f"- plain ran: {amp}{layout}, {plain['workers']} loader workers")
    print(f"- {len(done)} reps, interleaved (who goes first alternates); seconds are wall time per process\n")
    print("| first | fwk s | plain s | fwk/plain | fwk chose: precision, memory, jit, loader | val_loss fwk / plain |")
    print("| --- | --- | --- | --- | --- | --- |")
    for rep in done:
        print(rep.row())
    ratios = [rep.ratio for rep in done]
    fwk_s, plain_s = (statistics.median(getattr(r, side) for r in done) for side in ("fwk_s", "plain_s"))
    print(f"\nmedian wall time: fwk train {fwk_s:.1f} s, plain {plain_s:.1f} s")
    print(f"ok: whole {workload} fwk/plain {statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--dry", action="store_true", help="on the CPU at tiny sizes, the plain side in fp32")
    parser.add_argument("--reps", type=int, default=2, help="timed runs of each side")
    parser.add_argument("--warmup", type=int, default=0, help="untimed runs of each side first")
    args = parser.parse_args()
    if args.reps < 1 or args.warmup < 0:
        parser.error(f"--reps={args.reps} --warmup={args.warmup}: expected --reps >= 1 and --warmup >= 0")
    try:
        report(args.workload, measure(args.workload, args.dry, args.reps, args.warmup))
    except Failed as exc:
        print(f"FAILED: {exc}")
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug here or in fwk: one line for the check's report
        traceback.print_exc()  # for the report's output; the FAILED line below is its summary
        print(f"FAILED: {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
