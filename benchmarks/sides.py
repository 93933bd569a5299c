"""Training sides as whole processes, timed alike: ``fwk train`` and the plain loop.

A side is one process started by this one. Its figures are counted from the moment it is
started (imports, data, model and every decision included), as a user's clock counts:

- ``seconds``: start to the evaluation that reached the target (None: never reached);
- ``startup``: start to the first training step, and ``phases``: where that time went, as
  the side's summary.json says (fwk/track/startup.py);
- ``train_s``: the side's own training seconds to the target;
- ``peak_mb``: the peak proportional set size (PSS) of the process and its children (data
  workers, torchrun's worker), polled every 0.2 s: shared pages are counted once;
- ``final``: the last evaluation's metric.

Both sides write their times as Unix times (``summary.json``: ``first_step_at`` and
``target.at``); the parent subtracts the time it started them.

Cold and warm: every fwk side gets its own decision cache (``XDG_CACHE_HOME``) and
compile caches (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``). A fresh folder is a
first run on this machine: trial steps and compiles included ("cold"); a folder that an
earlier run of the same command filled is every later run ("warm").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FWK = Path(sys.executable).parent / "fwk"


@dataclass
class Outcome:
    seconds: float | None
    startup: float | None
    train_s: float | None
    steps: int | None
    final: float | None
    peak_mb: float
    wall: float
    reached: bool
    run_dir: Path | None = None
    phases: dict[str, float] | None = None  # summary.json's start-up phases, in seconds
    memory: dict[str, float] | None = None  # the resident MiB each start-up phase added, and at the first step


def stop_at(metric: str, target: float) -> str:
    return f"{metric}{'>=' if metric == 'val_acc' else '<='}{target}"


def caches(folder: Path) -> dict[str, str]:
    """The environment that points every cache a run fills at ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "XDG_CACHE_HOME": str(folder),
        "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
        "TRITON_CACHE_DIR": str(folder / "triton"),
    }


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
    except OSError:
        return 0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def tree_pss_mb(pid: int) -> float:
    """The PSS of ``pid`` and all its descendants, in MB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += _pss_kb(p)
        todo.extend(_children(p))
    return total / 1024


def launch(argv: list[str], env: dict[str, str], log: Path) -> tuple[float, float, int]:
    """Run ``argv`` to its end: its start (Unix time), the peak PSS of its tree in MB, and
    its exit status. Its output goes to ``log``."""
    peak, done = [0.0], threading.Event()
    with open(log, "w") as out:
        started = time.time()
        proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)

        def poll() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], tree_pss_mb(proc.pid))
                done.wait(0.2)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            code = proc.wait()
        finally:
            done.set()
            thread.join()
    return started, peak[0], code


def _outcome(summary: dict, started: float, peak: float, wall: float, metric: str, run_dir: Path | None) -> Outcome:
    target = summary.get("target") or {}
    reached = bool(target.get("reached"))
    first = summary.get("first_step_at")
    return Outcome(
        seconds=target["at"] - started if reached else None,
        startup=first - started if first else None,
        phases=summary.get("startup"),
        memory=summary.get("startup_memory_mib"),
        train_s=target.get("train_time_s") if reached else None,
        steps=target.get("step") if reached else summary.get("final_step"),
        final=(summary.get("eval") or {}).get(metric),
        peak_mb=peak,
        wall=wall,
        reached=reached,
        run_dir=run_dir,
    )


def _failed(what: str, code: int, log: Path) -> RuntimeError:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return RuntimeError(f"{what} exited {code}: {lines[-1] if lines else 'no output'}")


def fwk_side(
    overrides: list[str],
    metric: str,
    target: float,
    cache: Path,
    work: Path,
    stop: bool = True,
    runs: Path | None = None,
) -> Outcome:
    """``fwk train OVERRIDES train.stop_at=...`` as a user types it, in a fresh runs folder
    under ``work`` (or ``runs``), with its caches in ``cache`` (fresh: cold; filled: warm).
    ``stop`` False: no ``train.stop_at``, the whole budget (then ``seconds`` is None)."""
    runs = runs or Path(tempfile.mkdtemp(prefix="runs-", dir=work))
    until = [f"train.stop_at={stop_at(metric, target)}"] if stop else []
    argv = [str(FWK), "train", *overrides, *until, f"paths.runs={runs}"]
    log = runs / "fwk.log"
    started, peak, code = launch(argv, {**caches(cache), "FWK_RUNS": str(runs)}, log)
    wall = time.time() - started
    found = sorted(runs.glob("**/summary.json"))
    if code != 0 or not found:
        raise _failed("fwk train", code, log)
    return _outcome(json.loads(found[0].read_text()), started, peak, wall, metric, found[0].parent)


def plain_side(
    spec: dict, metric: str, target: float, work: Path, record: bool = False, module: str = "benchmarks.plain_loop"
) -> Outcome:
    """A plain loop's process on ``spec``: ``python -m MODULE`` takes a folder holding spec.json
    and writes summary.json there (``benchmarks/plain_loop.py``, whose docstring says what its
    spec holds; ``benchmarks/plain_resnet50.py``); ``record``: it also writes its rows as a run
    dir that ``fwk runs plot`` reads."""
    out = Path(tempfile.mkdtemp(prefix="plain-", dir=work))
    (out / "spec.json").write_text(json.dumps({**spec, "metric": metric, "target": target, "record": record}))
    log = out / "plain.log"
    argv = [sys.executable, "-m", module, str(out)]
    started, peak, code = launch(argv, {"PYTHONPATH": str(ROOT)}, log)
    wall = time.time() - started
    if code != 0 or not (out / "summary.json").exists():
        raise _failed(module, code, log)
    return _outcome(json.loads((out / "summary.json").read_text()), started, peak, wall, metric, out)


def plain_spec(overrides: list[str], **changes: object) -> dict:
    """The plain loop's spec for the recipe that ``overrides`` compose: its model, data,
    optimizer, schedule (a cosine over ``train.max_steps``), batch and evaluation; then
    ``changes`` (``lr_scale``: the recipe's lr times this; ``steps``: the cosine's length;
    any other spec key as is). A tuned length is the run's length: training stops there."""
    from omegaconf import OmegaConf

    from fwk.config.compose import compose
    from fwk.config.methods import label_smoothing
    from fwk.config.validate import to_typed

    cfg = OmegaConf.to_container(OmegaConf.structured(to_typed(compose(overrides))), resolve=True)
    t, o, s = cfg["train"], cfg["optim"], cfg["schedule"]
    if o["name"] not in ("adamw", "sgd"):
        raise ValueError(f"the plain loop trains with adamw or sgd, not {o['name']}")
    optim = {k: o.get(k) for k in ("name", "lr", "weight_decay", "beta1", "beta2", "momentum", "nesterov")}
    changes = dict(changes)
    optim["lr"] *= float(changes.pop("lr_scale", 1.0))
    steps = int(changes.pop("steps", t["max_steps"]))
    return {
        "model": cfg["model"],
        "data": cfg["data"],
        "optim": optim,
        "schedule": {"warmup_steps": s["warmup_steps"], "min_lr_ratio": s["min_lr_ratio"], "steps": steps},
        "seed": cfg["seed"],
        "batch_size": t["batch_size"],
        "max_steps": steps,
        "eval_every": t["eval_every"],
        "eval_batches": t["eval_batches"],
        "log_every": t["log_every"],
        "grad_clip": t["grad_clip"],
        "label_smoothing": label_smoothing(cfg),
        "device": t["device"] if t["device"] != "auto" else "cpu",
        "amp": None,
        "bn_recompute": 0,
        **changes,
    }
