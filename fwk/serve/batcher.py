"""Adaptive batching, in pure asyncio: requests to one model version are merged into batches.

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

Bounded: a request of more rows than ``max_batch_size`` runs as several batches; the rows
waiting are at most ``max_queue_rows`` (past that, ``submit`` raises ``Overloaded`` at once);
a request whose caller has gone (its deadline passed) is dropped before its batch runs, a
batch with no caller left does not run, and (given ``handles``) one running is stopped when
its last caller goes. One bad request fails alone: when a merged batch fails, its requests
run again one by one, and only those that fail alone get the error (``InputFailed`` when
another of the batch ran: the request's input, not the model).
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


class Overloaded(Exception):
    """An error for a request the version's full queue did not take: answer 503, try again later."""


class InputFailed(Exception):
    """An error for a request whose input the model failed on, run alone, while the others of
    its batch ran."""


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
    """A batcher that merges submitted arrays, rows first, into batches of at most
    ``max_batch_size`` rows."""

    def __init__(
        self,
        run: Callable[[np.ndarray], list[np.ndarray]],
        executor: Executor,
        slots: asyncio.Semaphore,
        max_batch_size: int,
        max_delay_ms: float,
        adaptive: bool = True,
        on_batch: Callable[[int, int, float], None] | None = None,
        max_queue_rows: int | None = None,
        handles: Callable[[], Any] | None = None,
    ) -> None:
        """Set up the batcher. ``max_queue_rows`` is the rows that may wait, and None means no
        bound.

        ``handles`` makes the handle of one run, onnxruntime's RunOptions, passed as
        ``run(x, handle)``. Setting ``handle.terminate = True`` from another thread stops that
        run. Without ``handles`` a run always ends by itself."""
        self._run, self._executor, self._slots, self._handles = run, executor, slots, handles
        self.max_batch_size, self.max_delay_s, self.adaptive = max_batch_size, max_delay_ms / 1000, adaptive
        self.max_queue_rows = max_queue_rows
        self.queued_rows = 0  # rows submitted and not yet in a batch
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
        """Return how long a batch of ``rows`` waits for more requests, counted from its oldest
        request."""
        if not self.adaptive:
            return self.max_delay_s
        est = self.estimate_s(rows)
        return self.max_delay_s if est is None else min(self.max_delay_s, est)

    # -- running ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._collect())

    async def submit(self, x: np.ndarray, high: bool = False) -> Result:
        """Run ``x`` in batches of at most ``max_batch_size`` rows and return its outputs. A
        larger request runs as several, and its parts' outputs are joined back. Raise
        ``Overloaded`` when its rows do not fit the queue."""
        if self._task is None or self._task.done():
            raise RuntimeError("the batcher is not running")
        rows = int(x.shape[0])
        if self.max_queue_rows is not None and self.queued_rows + rows > self.max_queue_rows:
            raise Overloaded(f"{self.queued_rows} rows are queued (serve.max_queue_rows={self.max_queue_rows})")
        if rows <= self.max_batch_size:
            return await self._submit(x, high)
        n = self.max_batch_size
        parts = await asyncio.gather(*(self._submit(x[i : i + n], high) for i in range(0, rows, n)))
        outputs = [np.concatenate(o) for o in zip(*(p.outputs for p in parts), strict=True)]
        return Result(
            outputs,
            max(p.batch_rows for p in parts),
            max(p.batch_requests for p in parts),
            max(p.queue_s for p in parts),
            sum(p.infer_s for p in parts),
        )

    async def _submit(self, x: np.ndarray, high: bool) -> Result:
        item = _Item(x, high, asyncio.get_running_loop().create_future())
        if self._last is not None:
            gap = item.t - self._last
            self.gap_s = gap if self.gap_s is None else (1 - EWMA_ALPHA) * self.gap_s + EWMA_ALPHA * gap
        self._last = item.t
        self.queued_rows += item.rows
        self._queue.put_nowait(item)
        return await item.future

    def timed_run(self, x: np.ndarray, handle: Any = None) -> tuple[list[np.ndarray], float]:
        """Make the blocking call and time it in the worker thread, since the pool's queueing
        is not run time."""
        t0 = time.perf_counter()
        out = self._run(x) if handle is None else self._run(x, handle)
        return out, time.perf_counter() - t0

    def _stopped_when_gone(self, batch: list[_Item]) -> Any:
        """Make a handle for the batch's run, terminated as soon as none of its callers waits."""
        if self._handles is None:
            return None
        handle = self._handles()

        def gone(_: asyncio.Future) -> None:
            if all(i.future.cancelled() for i in batch):
                handle.terminate = True

        for i in batch:
            i.future.add_done_callback(gone)
        return handle

    async def close(self) -> None:
        """Finish what is queued and running, then stop."""
        if self._task is None:
            return
        self._queue.put_nowait(_STOP)
        await self._task
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    def _taken(self, item: Any) -> Any:
        """Count an item off the queue as no longer waiting, and return it."""
        if isinstance(item, _Item):
            self.queued_rows -= item.rows
        return item

    async def _collect(self) -> None:
        carry: Any = None
        while True:
            first = carry if carry is not None else self._taken(await self._queue.get())
            carry = None
            if first is _STOP:
                return
            if first.future.done():  # its caller is gone (deadline): nothing to run it for
                continue
            await self._slots.acquire()  # meanwhile, requests pile up in the queue
            batch, rows = [first], first.rows
            while rows < self.max_batch_size and not batch[-1].high:
                try:
                    item = self._taken(self._queue.get_nowait())
                except asyncio.QueueEmpty:
                    delay = self.delay_s(rows)
                    wait = first.t + delay - time.perf_counter()
                    if wait <= 0 or (self.adaptive and self.gap_s is not None and self.gap_s > delay):
                        break  # waited enough, or no request is expected within the wait
                    try:
                        item = self._taken(await asyncio.wait_for(self._queue.get(), wait))
                    except asyncio.TimeoutError:
                        break
                if item is not _STOP and item.future.done():
                    continue
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
            batch = [i for i in batch if not i.future.done()]  # callers gone while it filled: not run for
            if not batch:
                return
            rows = sum(i.rows for i in batch)
            x = batch[0].x if len(batch) == 1 else np.concatenate([i.x for i in batch])  # (rows, ...)
            loop = asyncio.get_running_loop()
            handle = self._stopped_when_gone(batch)
            try:
                outs, seconds = await loop.run_in_executor(self._executor, self.timed_run, x, handle)
            except Exception as exc:
                if all(i.future.done() for i in batch):  # stopped: nobody waits for it any more
                    return
                if len(batch) == 1 and not batch[0].future.done():  # the model failed on this request alone
                    batch[0].future.set_exception(exc)
                elif len(batch) > 1:  # find the guilty: each request alone, so that the others still get their answer
                    await self._one_by_one(batch, start)
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

    async def _one_by_one(self, batch: list[_Item], start: float) -> None:
        """After a merged batch failed, run each of its requests alone, in the batch's slot."""
        loop, failed, ran = asyncio.get_running_loop(), [], 0
        for i in batch:
            if i.future.done():
                continue
            try:
                outs, seconds = await loop.run_in_executor(self._executor, self.timed_run, i.x)
            except Exception as exc:  # noqa: BLE001 - the model's error on this input: this caller's answer
                failed.append((i, exc))
                continue
            ran += 1
            if not i.future.done():
                i.future.set_result(Result(outs, i.rows, 1, start - i.t, seconds))
        for i, exc in failed:  # when none ran, the model failed, not an input
            if not i.future.done():
                i.future.set_exception(InputFailed(f"{type(exc).__name__}: {exc}") if ran else exc)
