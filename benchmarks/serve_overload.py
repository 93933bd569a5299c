"""`fwk serve` past its capacity: open-loop load at 10x what it can answer, on the digits CNN
and gpt_stdlib, with the serve group's defaults.

    .venv/bin/python -m benchmarks.serve_overload [--seconds 30] [--factor 10] [--recipes digits_cnn,gpt_stdlib]

For each recipe: a short training run and `fwk export --quantize none` (benchmarks/serve.py's
`exported`), then one `fwk serve` on loopback. Its capacity is measured first (closed loop, 64
clients, 5 s); then requests arrive at ``factor`` x that rate for ``seconds``, whatever the
replies do: an open loop, as real traffic is. Each goes out on a keep-alive connection of a
pool of at most 512, as a load balancer's (a new one when none is idle); an arrival that
finds all 512 busy is counted as not sent, rather than queued in the generator (a Python
generator cannot hold 10x a server's rate of waiting requests without its own event loop
lagging behind). So the server has 512 requests of demand at every moment, 4x
`serve.max_inflight`. Meanwhile a separate process asks `/v2/health/ready` every 50 ms and
the server's RSS is read every 100 ms. After the load stops, requests one at a time show
how soon the p50 latency is back to its quiet value.

What must hold (the "met" column): the server stays up; every request gets an answer (200,
or 503/429/504 from a bound), none hangs (60 s); peak RSS under ``--rss-mb``; the health check
under 100 ms throughout; the p50 back within 1.5x of its quiet value within 2 s. The load
generator shares the machine's cores with the server: the offered rate it reached is shown
beside the one it aimed at.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.serve import exchange, exported, request, start

HANG_S = 60.0  # a reply later than this after its request went out: hung
MAX_CONNECTIONS = 512
SHAPES = {"digits_cnn": ("FP32", (1, 1, 8, 8)), "gpt_stdlib": ("INT64", (8, 128))}  # the gpt: 8 rows


class Pool:
    """Keep-alive connections to the server: an idle one, else a new one, at most ``most``
    open (as a load balancer's pool); ``take`` is None when all of them are busy."""

    def __init__(self, port: int, most: int = MAX_CONNECTIONS) -> None:
        self.port, self.idle, self.opened, self.busy, self.most = port, [], 0, 0, most

    async def take(self):
        if self.busy >= self.most:
            return None
        self.busy += 1
        while self.idle:
            reader, writer = conn = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return conn
            writer.close()  # the server closed it while idle (uvicorn's keep-alive timeout): as urllib3 does
        self.opened += 1
        try:
            return await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            self.busy -= 1
            raise

    def give(self, conn) -> None:
        self.idle.append(conn)
        self.busy -= 1

    def lost(self, conn) -> None:
        conn[1].close()
        self.busy -= 1


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def probe_health(port: int, seconds: float, out) -> None:
    """In its own process (the generator's event loop must not delay it): ``GET
    /v2/health/ready`` every 50 ms on its own connection for ``seconds``; (status, seconds) to ``out``."""

    async def main() -> list[tuple[int, float]]:
        seen: list[tuple[int, float]] = []
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        ask = f"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        end = time.perf_counter() + seconds
        try:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                try:
                    status = await asyncio.wait_for(exchange(reader, writer, ask), 10)
                except (asyncio.TimeoutError, OSError):
                    status = 0
                seen.append((status, time.perf_counter() - t0))
                await asyncio.sleep(0.05)
        finally:
            writer.close()
        return seen

    out.put(asyncio.run(main()))


async def watch_rss(pid: int, stop: asyncio.Event, peak: list[float]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss_mb(pid))
        await asyncio.sleep(0.1)


async def open_loop(port: int, pid: int, data: bytes, rate: float, seconds: float) -> dict:
    """Requests at ``rate`` per second for ``seconds``, answered or not; what came back."""
    pool, codes, latencies, pending = Pool(port), Counter(), [], set()
    peak, stop = [rss_mb(pid)], asyncio.Event()
    ctx = multiprocessing.get_context("fork")
    answers = ctx.Queue()
    prober = ctx.Process(target=probe_health, args=(port, seconds, answers), daemon=True)
    prober.start()
    watcher = asyncio.create_task(watch_rss(pid, stop, peak))

    async def one() -> None:
        try:
            conn = await pool.take()
        except OSError as exc:
            codes[f"connect: {type(exc).__name__}"] += 1
            return
        if conn is None:  # all the pool's connections are waiting for their replies
            codes["not sent"] += 1
            return
        t0 = time.perf_counter()
        try:
            status = await asyncio.wait_for(exchange(*conn, data), HANG_S)
        except asyncio.TimeoutError:
            codes["hung"] += 1
            pool.lost(conn)
            return
        except (OSError, asyncio.IncompleteReadError) as exc:
            codes[f"connection: {type(exc).__name__}"] += 1
            pool.lost(conn)
            return
        codes[status] += 1
        pool.give(conn)
        if status == 200:
            latencies.append(time.perf_counter() - t0)

    start_t, sent = time.perf_counter(), 0
    while (now := time.perf_counter()) < start_t + seconds:
        due = int((now - start_t) * rate) + 1
        for _ in range(due - sent):
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
        sent = due
        await asyncio.sleep(0.001)
    offered = sent / (time.perf_counter() - start_t)
    if pending:
        await asyncio.wait(pending, timeout=HANG_S + 5)
    stop.set()
    await watcher
    health = await asyncio.to_thread(answers.get, True, 30)
    prober.join(10)
    for _, writer in pool.idle:
        writer.close()
    lat = np.array(latencies) * 1000
    health_ms = np.array([s for _, s in health]) * 1000
    return {
        "aimed": rate,
        "offered": offered,
        "arrived": sent,
        "sent": sent - codes["not sent"],
        "codes": dict(codes),
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
        "health_max_ms": float(health_ms.max()) if health_ms.size else None,
        "health_p99_ms": float(np.percentile(health_ms, 99)) if health_ms.size else None,
        "health_failed": sum(s != 200 for s, _ in health),
        "peak_rss_mb": peak[0],
        "connections": pool.opened,
    }


async def sequential_p50(port: int, data: bytes, seconds: float) -> float:
    """p50 of requests sent one at a time for ``seconds``, in ms."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    took, end = [], time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await exchange(reader, writer, data)
            took.append(time.perf_counter() - t0)
    finally:
        writer.close()
    return float(np.percentile(took, 50) * 1000)


def measure(recipe: str, runs: Path, seconds: float, factor: float, rss_bound: float) -> dict:
    export = exported(recipe, runs)
    datatype, shape = SHAPES[recipe]
    proc, port = start(export, runs, [])
    try:
        data = request(port, recipe, datatype, shape)
        quiet = asyncio.run(sequential_p50(port, data, 2.0))
        capacity = asyncio.run(closed_loop(port, data, 64, 5.0))
        print(f"{recipe}: quiet p50 {quiet:.2f} ms, capacity {capacity['qps']:.0f}/s", file=sys.stderr, flush=True)
        got = asyncio.run(open_loop(port, proc.pid, data, factor * capacity["qps"], seconds))
        t_end = time.perf_counter()
        after, back_in = None, None
        while time.perf_counter() - t_end < 10:
            after = asyncio.run(sequential_p50(port, data, 0.5))
            if after <= 1.5 * quiet:
                back_in = time.perf_counter() - t_end
                break
        alive = proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)
    answered = sum(n for c, n in got["codes"].items() if c in (200, 429, 503, 504))  # of those sent
    met = (
        alive
        and answered == got["sent"]
        and got["peak_rss_mb"] < rss_bound
        and (got["health_max_ms"] or 1e9) < 100
        and got["health_failed"] == 0
        and back_in is not None
        and back_in <= 2.0
    )
    return {
        "recipe": recipe,
        "quiet_p50_ms": quiet,
        "capacity_qps": capacity["qps"],
        **got,
        "alive": alive,
        "p50_after_ms": after,
        "back_in_s": back_in,
        "rss_bound_mb": rss_bound,
        "met": met,
    }


async def closed_loop(port: int, data: bytes, clients: int, seconds: float) -> dict:
    """Closed-loop QPS with ``clients`` keep-alive connections, each sending as soon as its reply is in."""
    done, end = [0], time.perf_counter() + seconds

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < end:
                await exchange(reader, writer, data)
                done[0] += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return {"qps": done[0] / (time.perf_counter() - t0)}


def table(rows: list[dict]) -> str:
    head = (
        "| recipe | capacity /s | offered /s (aimed) | arrived | not sent (512 busy) | sent | 200 | shed 503/429 "
        "| 504 | other | hung | p50 / p99 ms | health max / p99 ms | peak RSS MB (bound) "
        "| quiet p50 -> after ms (back in) | met |"
    )
    lines = [head, "|" + "---|" * 16]
    for r in rows:
        c = r["codes"]
        other = sum(n for k, n in c.items() if k not in (200, 429, 503, 504, "hung", "not sent"))
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        back = "-" if r["back_in_s"] is None else f"{r['back_in_s']:.1f} s"
        lines.append(
            f"| {r['recipe']} | {r['capacity_qps']:.0f} | {r['offered']:.0f} ({r['aimed']:.0f}) | {r['arrived']} | "
            f"{c.get('not sent', 0)} | {r['sent']} | "
            f"{c.get(200, 0)} | {c.get(503, 0) + c.get(429, 0)} | {c.get(504, 0)} | {other} | {c.get('hung', 0)} | "
            f"{fmt(r['p50_ms'])} / {fmt(r['p99_ms'])} | {fmt(r['health_max_ms'])} / {fmt(r['health_p99_ms'])} | "
            f"{r['peak_rss_mb']:.0f} ({r['rss_bound_mb']:.0f}) | {r['quiet_p50_ms']:.2f} -> {fmt(r['p50_after_ms'])} "
            f"({back}) | {'yes' if r['met'] else 'no'} |"
        )
    return "\n".join(lines)


def rows(quick: bool) -> list:
    """make bench's serve group: each must-hold figure of each recipe as a row against its bound."""
    from benchmarks.harness import Row, Side, check

    runs = Path(os.environ.get("FWK_RUNS", "runs")) / "bench-serve"
    recipes, seconds = (["digits_cnn"], 3.0) if quick else (["digits_cnn", "gpt_stdlib"], 30.0)
    out = []
    for recipe in recipes:
        r = measure(recipe, runs, seconds, 10.0, 1024.0)
        c = r["codes"]
        answered = sum(n for k, n in c.items() if k in (200, 429, 503, 504))
        what = f"{recipe}, open loop at {r['offered']:.0f}/s (10x capacity {r['capacity_qps']:.0f}/s) for {seconds:g} s"
        figures = [
            (
                "requests answered",
                answered / max(r["sent"], 1),
                Side("answered", answered, "requests"),
                Side("sent", r["sent"], "requests"),
                "answered/sent",
                ">= 1.00x",
            ),
            (
                "health check, slowest",
                (r["health_max_ms"] or 1e9) / 100,
                Side("slowest", r["health_max_ms"] or 0, "ms"),
                Side("bound", 100, "ms"),
                "slowest/100 ms",
                "< 1.00x",
            ),
            (
                "peak RSS",
                r["peak_rss_mb"] / 1024,
                Side("peak", r["peak_rss_mb"], "MB"),
                Side("bound", 1024, "MB"),
                "peak/bound",
                "< 1.00x",
            ),
            (
                "p50 back to quiet",
                (r["back_in_s"] if r["back_in_s"] is not None else 1e9) / 2,
                Side("back in", r["back_in_s"] or 0, "s"),
                Side("bound", 2, "s"),
                "seconds/2 s",
                "<= 1.00x",
            ),
        ]
        for name, ratio, a, b, how, target in figures:
            note = f"{c.get(200, 0)} answered 200, {c.get(503, 0) + c.get(429, 0)} shed, {c.get(504, 0)} past deadline"
            out.append(
                Row("serve", f"{name}: {what}", how, ratio, ratio, ratio, a, b, target, check(ratio, target), note)
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipes", default="digits_cnn,gpt_stdlib")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds of open-loop load per recipe")
    ap.add_argument("--factor", type=float, default=10.0, help="offered rate / measured capacity")
    ap.add_argument("--rss-mb", type=float, default=1024.0, help="the server's peak RSS must stay under this")
    ap.add_argument("--runs", type=Path, default=Path(os.environ.get("FWK_RUNS", "runs")) / "bench-serve")
    a = ap.parse_args()
    rows = [measure(r, a.runs, a.seconds, a.factor, a.rss_mb) for r in a.recipes.split(",")]
    for r in rows:
        print(json.dumps(r, default=str), file=sys.stderr)
    print(" ".join(["$", "python", *sys.argv]))
    print(table(rows))
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (client and server share them)")


if __name__ == "__main__":
    main()
