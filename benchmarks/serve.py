"""What adaptive batching buys `fwk serve`: QPS and p50/p99 latency, batching on vs off, in one run.

    .venv/bin/python -m benchmarks.serve [--recipes digits_cnn,resnet_digits] [--seconds 4] [--requests 4000]

For each recipe: a short training run (`fwk train recipe=NAME train.max_steps=20`: the
weights do not change the speed), `fwk export --quantize none`, then two `fwk serve`
processes on loopback ports: adaptive batching (the serve group's defaults) and batching
off (serve.max_batch_size=1). Closed-loop load: C clients, each sending its next request
(one image, the binary tensor extension, keep-alive HTTP/1.1) as soon as its reply
arrives, at C = 1, 8, 64; both servers take turns at each C. Every measurement is bounded
by --requests and --seconds (after 0.5 s of unmeasured warm-up traffic).

The issue's targets: >= 3x the QPS of batching off at concurrency 64; p99 at concurrency 1
no worse than 1.2x batching off. The load generator shares the CPU with the server: on a
2-core machine the client's own work caps what any server can show.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

LEVELS = (1, 8, 64)


def _fwk(*args: str, runs: Path) -> str:
    env = {**os.environ, "FWK_RUNS": str(runs)}
    out = subprocess.run([sys.executable, "-m", "fwk", *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"fwk {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout


def exported(recipe: str, runs: Path) -> str:
    """The export id of a short run of ``recipe`` (trained and exported now, or found again)."""
    print(f"training and exporting {recipe} under {runs} ...", file=sys.stderr, flush=True)
    out = _fwk("train", f"recipe={recipe}", "train.max_steps=20", "train.eval_every=0", "jit=off", runs=runs)
    run = re.search(r"run ([0-9a-f]{10}) (?:complete|is already complete)", out).group(1)
    quick = ["export.val_batches=1", "export.warmup=0", "export.iterations=1", "export.latency_batch=2"]
    out = _fwk("export", run, "--quantize", "none", "--max-accuracy-drop", "100", *quick, runs=runs)
    return re.search(r"export dir: .*/exports/([0-9a-f]{10})", out).group(1)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(export: str, runs: Path, settings: list[str]) -> tuple[subprocess.Popen, int]:
    port = _port()
    env = {**os.environ, "FWK_RUNS": str(runs)}
    cmd = [sys.executable, "-m", "fwk", "serve", export, "--port", str(port), *settings]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"fwk serve exited: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("fwk serve was not ready in 120 s")


def request(port: int, model: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    """One infer request (the binary tensor extension), as bytes on the wire."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32) if datatype == "FP32" else rng.integers(0, 256, shape)
    tensor = {"name": "input", "shape": list(shape), "datatype": datatype, "parameters": {"binary_data_size": x.nbytes}}
    head = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
    body = head + x.tobytes()
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> int:
    """Send one request on the keep-alive connection and read its whole reply; the HTTP status
    (0: the server closed the connection instead)."""
    writer.write(data)
    status = await reader.readline()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return int(status.split()[1]) if status else 0


async def _client(port: int, request: bytes, until: list[float], latencies: list[float], budget: list[int]) -> None:
    """One closed-loop client on a keep-alive connection: send, read the whole reply, repeat."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while budget[0] > 0 and time.perf_counter() < until[1]:
            t0 = time.perf_counter()
            status = await exchange(reader, writer, request)
            if status != 200:
                raise RuntimeError(f"server answered {status}")
            if t0 >= until[0]:  # after the warm-up
                latencies.append(time.perf_counter() - t0)
                budget[0] -= 1
    finally:
        writer.close()


def load(port: int, model: str, shape: tuple[int, ...], clients: int, seconds: float, requests: int) -> dict:
    """Closed-loop load from ``clients`` connections: QPS and latency percentiles."""
    data = request(port, model, "FP32", shape)
    latencies: list[float] = []

    async def main() -> float:
        t0 = time.perf_counter()
        until = [t0 + 0.5, t0 + 0.5 + seconds]
        budget = [requests]
        await asyncio.gather(*(_client(port, data, until, latencies, budget) for _ in range(clients)))
        return time.perf_counter() - until[0]

    took = asyncio.run(main())
    lat = np.array(latencies) * 1000
    return {
        "qps": len(lat) / took,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "requests": len(lat),
    }


def _mean_batch(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = {
        m: sum(float(v) for v in re.findall(rf"^fwk_serve_batch_size_{m}{{.*}} (\S+)$", text, re.M))
        for m in ("sum", "count")
    }
    return total["sum"] / total["count"] if total["count"] else 0.0


def run(
    recipes: tuple[str, ...] = ("digits_cnn", "resnet_digits"),
    levels: tuple[int, ...] = LEVELS,
    seconds: float = 4.0,
    requests: int = 4000,
    runs: Path = Path("runs/bench-serve"),
) -> list[dict]:
    """One row per recipe and concurrency: both modes' figures and their ratios."""
    rows = []
    for recipe in recipes:
        export = exported(recipe, runs)
        shape = (1, 1, 8, 8) if recipe == "digits_cnn" else (1, 1, 32, 32)
        modes = {"adaptive": [], "off": ["serve.max_batch_size=1"]}
        servers = {m: start(export, runs, s) for m, s in modes.items()}
        try:
            for c in levels:
                got = {}
                for mode, (_, port) in servers.items():
                    before = _mean_batch(port)
                    got[mode] = load(port, recipe, shape, c, seconds, requests) | {"batch_after": _mean_batch(port)}
                    print(f"{recipe} c={c} {mode}: {got[mode]} (mean batch so far {before:.2f})", file=sys.stderr)
                on, off = got["adaptive"], got["off"]
                rows.append(
                    {
                        "recipe": recipe,
                        "concurrency": c,
                        "qps_adaptive": on["qps"],
                        "qps_off": off["qps"],
                        "qps_ratio": on["qps"] / off["qps"],
                        "p50_adaptive_ms": on["p50_ms"],
                        "p50_off_ms": off["p50_ms"],
                        "p99_adaptive_ms": on["p99_ms"],
                        "p99_off_ms": off["p99_ms"],
                        "p99_ratio": on["p99_ms"] / off["p99_ms"],
                        "requests": on["requests"] + off["requests"],
                        "mean_batch_adaptive": on["batch_after"],
                    }
                )
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(30)
    return rows


def table(rows: list[dict]) -> str:
    head = (
        "| recipe | C | QPS adaptive | QPS off | QPS ratio | p50 ms adaptive / off | p99 ms adaptive / off "
        "| p99 ratio | mean batch (cumulative) |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['recipe']} | {r['concurrency']} | {r['qps_adaptive']:.0f} | {r['qps_off']:.0f} | "
            f"{r['qps_ratio']:.2f}x | {r['p50_adaptive_ms']:.2f} / {r['p50_off_ms']:.2f} | "
            f"{r['p99_adaptive_ms']:.2f} / {r['p99_off_ms']:.2f} | {r['p99_ratio']:.2f}x | "
            f"{r['mean_batch_adaptive']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipes", default="digits_cnn,resnet_digits")
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per mode and concurrency (bound)")
    ap.add_argument("--requests", type=int, default=4000, help="measured requests per mode and concurrency (bound)")
    ap.add_argument("--runs", type=Path, default=Path(os.environ.get("FWK_RUNS", "runs")) / "bench-serve")
    a = ap.parse_args()
    rows = run(tuple(a.recipes.split(",")), LEVELS, a.seconds, a.requests, a.runs)
    print(table(rows))
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (client and server share them)")


if __name__ == "__main__":
    main()
