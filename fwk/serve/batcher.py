"""Adaptive batching: requests to one model version are merged into batches (pure asyncio).

A batch closes when it holds ``max_batch_size`` rows, or when its oldest request has
waited ``delay_s(rows)``: at most ``max_delay_ms``, and (adaptive) at most the measured
run time of a batch of the current size. Waiting longer than a batch takes to run gains
nothing: requests that arrive meanwhile queue for the next batch anyway. A high-priority
request closes the batch at once, and so does a lull: when requests have been arriving
further apart than the wait (EWMA of the gaps), waiting only adds latency (one closed-loop
caller never has company). Batches run in a thread pool (``run`` is a blocking
call, onnxruntime's ``session.run``); ``slots`` bounds the batches running at once to the
pool's threads, so while every thread is busy requests pile up into the next batch
instead of into the pool's queue as batches of one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

EWMA_ALPHA = 0.2  # weight of the newest batch's run time in the running estimate per batch size
_STOP = object()


@dataclass
class Result:
    """One request's outputs and how it was served."""

    outputs: list[np.ndarray]
    batch_rows: int  # rows in the batch it ran in
    batch_requests: int  # requests merged into that batch
    queue_s: float  # from submit to the batch's start
    infer_s: float  # the batch's run time


@dataclass
class _Item:
    x: np.ndarray
    high: bool
    future: asyncio.Future
    t: float = field(default_factory=time.perf_counter)

    @property
    def rows(self) -> int:
        return int(self.x.shape[0])


class Batcher:
    """Merge submitted arrays (rows first) into batches of at most ``max_batch_size`` rows."""

    def __init__(
        self,
        run: Callable[[np.ndarray], list[np.ndarray]],
        executor: Executor,
        slots: asyncio.Semaphore,
        max_batch_size: int,
        max_delay_ms: float,
        adaptive: bool = True,
        on_batch: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self._run, self._executor, self._slots = run, executor, slots
        self.max_batch_size, self.max_delay_s, self.adaptive = max_batch_size, max_delay_ms / 1000, adaptive
        self._on_batch = on_batch
        self.seconds: dict[int, float] = {}  # batch rows -> EWMA of its run time
        self.gap_s: float | None = None  # EWMA of the time between two submits
        self._last: float | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._running: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None

    # -- the adaptive delay -------------------------------------------------------------
    def record(self, rows: int, seconds: float) -> None:
        old = self.seconds.get(rows)
        self.seconds[rows] = seconds if old is None else (1 - EWMA_ALPHA) * old + EWMA_ALPHA * seconds

    def estimate_s(self, rows: int) -> float | None:
        """Run time of a batch of ``rows``: measured, else scaled from the nearest measured size."""
        if rows in self.seconds:
            return self.seconds[rows]
        if not self.seconds:
            return None
        near = min(self.seconds, key=lambda r: abs(r - rows))
        return self.seconds[near] * rows / near

    def delay_s(self, rows: int) -> float:
        """How long a batch of ``rows`` waits (from its oldest request) for more requests."""
        if not self.adaptive:
            return self.max_delay_s
        est = self.estimate_s(rows)
        return self.max_delay_s if est is None else min(self.max_delay_s, est)

    # -- running ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._collect())

    async def submit(self, x: np.ndarray, high: bool = False) -> Result:
        if self._task is None or self._task.done():
            raise RuntimeError("the batcher is not running")
        item = _Item(x, high, asyncio.get_running_loop().create_future())
        if self._last is not None:
            gap = item.t - self._last
            self.gap_s = gap if self.gap_s is None else (1 - EWMA_ALPHA) * self.gap_s + EWMA_ALPHA * gap
        self._last = item.t
        self._queue.put_nowait(item)
        return await item.future

    def timed_run(self, x: np.ndarray) -> tuple[list[np.ndarray], float]:
        """The blocking call, timed in the worker thread (the pool's queueing is not run time)."""
        t0 = time.perf_counter()
        out = self._run(x)
        return out, time.perf_counter() - t0

    async def close(self) -> None:
        """Finish what is queued and running, then stop."""
        if self._task is None:
            return
        self._queue.put_nowait(_STOP)
        await self._task
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    async def _collect(self) -> None:
        carry: Any = None
        while True:
            first = carry if carry is not None else await self._queue.get()
            carry = None
            if first is _STOP:
                return
            await self._slots.acquire()  # meanwhile, requests pile up in the queue
            batch, rows = [first], first.rows
            while rows < self.max_batch_size and not batch[-1].high:
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    delay = self.delay_s(rows)
                    wait = first.t + delay - time.perf_counter()
                    if wait <= 0 or (self.adaptive and self.gap_s is not None and self.gap_s > delay):
                        break  # waited enough, or no request is expected within the wait
                    try:
                        item = await asyncio.wait_for(self._queue.get(), wait)
                    except asyncio.TimeoutError:
                        break
                # the next batch: a stop (after this batch), too many rows, or other trailing dims
                if item is _STOP or rows + item.rows > self.max_batch_size or item.x.shape[1:] != first.x.shape[1:]:
                    carry = item
                    break
                batch.append(item)
                rows += item.rows
            task = asyncio.get_running_loop().create_task(self._dispatch(batch, rows))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _dispatch(self, batch: list[_Item], rows: int) -> None:
        start = time.perf_counter()
        try:
            x = batch[0].x if len(batch) == 1 else np.concatenate([i.x for i in batch])  # (rows, ...)
            outs, seconds = await asyncio.get_running_loop().run_in_executor(self._executor, self.timed_run, x)
        except Exception as exc:  # the model failed on this batch: every caller in it gets the error
            for i in batch:
                if not i.future.done():
                    i.future.set_exception(exc)
            return
        finally:
            self._slots.release()
        self.record(rows, seconds)
        if self._on_batch is not None:
            self._on_batch(rows, len(batch), seconds)
        at = 0
        for i in batch:
            mine = [o[at : at + i.rows] for o in outs]  # each caller's rows, in submit order
            at += i.rows
            if not i.future.done():
                i.future.set_result(Result(mine, rows, len(batch), start - i.t, seconds))
