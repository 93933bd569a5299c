"""What a run needs to be re-run exactly: deterministic kernels when ``train.deterministic``
asks, and ``env.json``, a record of where each launch ran.

``config.yaml`` (the resolved config, seed included) and ``meta.json`` (code version,
overrides as typed, data fingerprint, lineage; written by the launcher) say *what* ran;
the checkpoints hold the RNG states. ``env.json`` adds, per launch, *where* and *how*: the
hardware, the library versions, the torch settings that change numerics, and the data
pipeline (datasets and their transforms, as text). Rank 0 writes it.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from collections.abc import Callable
from typing import Any

import torch

from fwk.data.base import DataBundle
from fwk.distributed.group import Dist
from fwk.strategies import hardware
from fwk.track.status import read_json
from fwk.track.store import RunDir, versions, write_atomic

ENV_FILE = "env.json"


def deterministic(on: bool) -> Callable[[], None]:
    """Set deterministic kernels and no cuDNN autotuning for one run, and return what puts the
    process's previous settings back. ``train()`` runs several times in one process, in fwk
    export's retraining and in fwk profile. Call it before CUDA is first used, since cuBLAS
    reads its workspace setting when it creates its handle. Off, the default, lets cuDNN time
    its convolution algorithms per shape and keep the fastest, as NVIDIA's performance guide
    advises. CUDA runs are not bit-reproducible without ``on`` anyway, because cuDNN's backward
    kernels accumulate with atomics."""
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )

    def undo() -> None:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[2], before[3]

    if not on:
        torch.backends.cudnn.benchmark = True
        return undo
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read once, by cuBLAS: left set
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return undo


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def machine(dist: Dist) -> dict[str, Any]:
    """Describe this node's hardware and the torch build and settings that change numerics."""
    out: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "torch_threads": torch.get_num_threads(),
        "device": hardware.probe(dist.device).text,
        "world_size": dist.world_size,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "matmul_precision": torch.get_float32_matmul_precision(),
    }
    if torch.cuda.is_available():
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        out["gpus"] = [f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}" for p in props]
        out["cuda"] = torch.version.cuda
        out["cudnn"] = torch.backends.cudnn.version()
        out["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        out["cudnn_benchmark"] = torch.backends.cudnn.benchmark
    return out


def describe(dataset: Any) -> str:
    """Describe a data set as text: its class, size and transform, the augmentation pipeline."""
    text = f"{type(dataset).__name__}, {len(dataset):,} items"
    transform = getattr(dataset, "transform", None)
    if transform is not None:
        text += f"; transform: {' '.join(repr(transform).split())}"
    return text


def pipeline(data: DataBundle) -> dict[str, Any]:
    out: dict[str, Any] = {"task": data.task, "train": describe(data.train), "val": describe(data.val)}
    if data.mean is not None:
        out["normalize"] = {"mean": list(data.mean), "std": list(data.std or ())}
    return out


def record_launch(
    run: RunDir, dist: Dist, data: DataBundle, seed: int, step: int, decisions: dict[str, Any] | None = None
) -> None:
    """Append this launch to ``env.json`` on rank 0, with the measured decisions made so far.
    It starts at ``step``: 0, or where it resumed. ``record_decisions`` adds later decisions."""
    if not dist.is_main:
        return
    env = read_json(run.path / ENV_FILE) or {"launches": []}
    env["launches"].append(
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "from_step": step,
            "seed": seed,
            "machine": machine(dist),
            "versions": versions(),
            "data": pipeline(data),
            "pid": os.getpid(),  # this launch's entry is the one its decisions update
            "decisions": decisions or {},
        }
    )
    write_atomic(run.path / ENV_FILE, json.dumps(env, indent=2, default=str) + "\n")


def record_decisions(run: RunDir, decisions: dict[str, Any]) -> None:
    """Write the decisions of this launch so far into its ``env.json`` entry. Rank 0 calls it.
    Before ``record_launch`` made the entry there is nothing to update: it takes them then."""
    env = read_json(run.path / ENV_FILE)
    if not env or not env.get("launches") or env["launches"][-1].get("pid") != os.getpid():
        return
    env["launches"][-1]["decisions"] = decisions
    write_atomic(run.path / ENV_FILE, json.dumps(env, indent=2, default=str) + "\n")
