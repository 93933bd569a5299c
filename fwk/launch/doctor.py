"""The checks behind `fwk doctor`: an environment report, and collectives across processes."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import queue
import re
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _available_memory() -> str:
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return f"{int(info['MemAvailable'].split()[0]) / 2**20:.1f} GiB available"
    except (OSError, KeyError, ValueError):
        return "unknown"


def report() -> list[tuple[str, str]]:
    """List (key, value) lines: versions, devices, CPU features, and what fwk's auto options pick."""
    from fwk.config.schema import KernelsConfig
    from fwk.strategies import hardware
    from fwk.strategies.hardware import choose_format
    from fwk.strategies.kernels import use_triton

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    features = hardware.probe(device)
    rows = [
        ("python", platform.python_version()),
        ("torch", f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})"),
        ("fwk", _version("fwk")),
        ("triton", _version("triton")),
        ("hydra-core", _version("hydra-core")),
        ("cpu", f"{features.text if device.type == 'cpu' else hardware.probe(torch.device('cpu')).text}"),
        ("cores", str(os.cpu_count())),
        ("memory", _available_memory()),
    ]
    if device.type == "cuda":
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            name = torch.cuda.get_device_name(i)
            major, minor = torch.cuda.get_device_capability(i)
            rows.append(
                (f"cuda:{i}", f"{name}, capability {major}.{minor}, {free / 2**30:.1f} / {total / 2**30:.1f} GiB free")
            )
        rows.append(("nccl", ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else "no"))
    else:
        rows.append(("cuda", "no CUDA device"))
    rows.append(("gloo", "yes" if dist.is_available() and dist.is_gloo_available() else "no"))
    prior = choose_format(features, device)
    tried = f"{prior} if it beats fp32 in the run's trial steps" if prior != "fp32" else "fp32 (no fast bf16 units)"
    rows.append(("precision=auto picks", tried))
    rows.append(("kernels=auto picks", "triton" if use_triton(KernelsConfig(), device) else "plain PyTorch"))
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, timeout: float, stall_rank: int, answers: mp.Queue) -> None:
    """Run one process of the check: join, pass a monitored barrier, all-reduce and answer."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # gloo's own complaints: the parent reports in one line
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if cuda:
        torch.cuda.set_device(rank)
    wait = timedelta(seconds=timeout)
    try:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world, timeout=wait)
        # gloo's monitored barrier: rank 0 learns which ranks never arrived (NCCL has none)
        monitor = dist.new_group(backend="gloo") if cuda else None
        if rank == stall_rank:
            time.sleep(timeout * 3)  # a rank that hangs: the others must not wait for it forever
            return
        t0 = time.perf_counter()
        try:
            dist.monitored_barrier(group=monitor, timeout=wait, wait_all_ranks=True)
        except RuntimeError as exc:
            if rank == 0:
                late = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", str(exc))
                answers.put((0, "missing", [int(r) for r in re.findall(r"\d+", late.group(1))] if late else None))
            return
        value = torch.ones((), device=f"cuda:{rank}" if cuda else "cpu")
        dist.all_reduce(value)
        answers.put((rank, "ok", (float(value), time.perf_counter() - t0)))
        dist.destroy_process_group()  # leaving with a live group aborts in gloo's threads
    except Exception as exc:  # e.g. a peer that never joined: the parent names who did not answer
        answers.put((rank, "error", str(exc).splitlines()[0] if str(exc) else type(exc).__name__))


def collectives(world: int, timeout: float, stall_rank: int = -1) -> tuple[list[int], float]:
    """Start ``world`` processes, and return the ranks that did not answer in time and the
    slowest answer in s."""
    ctx = mp.get_context("spawn")
    answers: mp.Queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, timeout, stall_rank, answers), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    ok: dict[int, float] = {}
    missing: list[int] | None = None
    deadline = time.monotonic() + timeout + 30  # + process start and torch import
    while len(ok) < world and missing is None and time.monotonic() < deadline:
        try:
            rank, kind, payload = answers.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if kind == "ok" and payload[0] == world:
            ok[rank] = payload[1]
        elif kind == "missing" and payload:
            missing = payload
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    if missing is None:
        missing = [r for r in range(world) if r not in ok]
    return missing, max(ok.values(), default=0.0)
