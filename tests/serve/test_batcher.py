"""The adaptive batcher alone (no HTTP, no model): closing rules, callers' rows, errors."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from fwk.serve.batcher import Batcher, InputFailed, Overloaded


def _double(x: np.ndarray) -> list[np.ndarray]:
    return [x * 2, x.sum(axis=tuple(range(1, x.ndim)))]


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def _batcher(run=_double, slots: int = 2, **kw) -> Batcher:
    kw = {"max_batch_size": 8, "max_delay_ms": 5.0, "adaptive": True} | kw
    b = Batcher(run, ThreadPoolExecutor(slots), asyncio.Semaphore(slots), **kw)
    b.start()
    return b


def test_full_batch_closes_without_waiting_and_each_caller_gets_its_rows() -> None:
    async def main():
        b = _batcher(max_batch_size=6, max_delay_ms=5000, adaptive=False)
        xs = [np.full((rows, 3), tag, np.float32) for tag, rows in enumerate([1, 2, 3], start=1)]
        t0 = time.perf_counter()
        results = await asyncio.gather(*(b.submit(x) for x in xs))
        took = time.perf_counter() - t0
        await b.close()
        return xs, results, took

    xs, results, took = _run(main())
    assert took < 1.0  # 6 rows = max_batch_size: closed at once, not after the 5 s delay
    for x, r in zip(xs, results, strict=True):
        assert r.batch_rows == 6 and r.batch_requests == 3
        np.testing.assert_array_equal(r.outputs[0], x * 2)  # its own rows, in its own order
        np.testing.assert_array_equal(r.outputs[1], x.sum(1))


def test_many_callers_are_batched_and_answered_in_order() -> None:
    async def main():
        b = _batcher(max_batch_size=16, max_delay_ms=50, adaptive=False)
        xs = [np.full((1 + i % 3, 2), i, np.float32) for i in range(40)]
        results = await asyncio.gather(*(b.submit(x) for x in xs))
        await b.close()
        return xs, results

    xs, results = _run(main())
    for x, r in zip(xs, results, strict=True):
        np.testing.assert_array_equal(r.outputs[0], x * 2)
    assert max(r.batch_requests for r in results) > 1
    assert all(r.batch_rows <= 16 for r in results)


def test_high_priority_closes_the_batch_at_once() -> None:
    async def main():
        b = _batcher(max_delay_ms=2000, adaptive=False)
        t0 = time.perf_counter()
        normal = asyncio.ensure_future(b.submit(np.ones((1, 2), np.float32)))
        await asyncio.sleep(0.02)
        high = await b.submit(np.zeros((1, 2), np.float32), high=True)
        took = time.perf_counter() - t0
        low = await normal
        await b.close()
        return high, low, took

    high, low, took = _run(main())
    assert took < 0.5  # not the 2 s max_delay_ms
    assert high.batch_requests == 2 and low.batch_requests == 2  # it took the waiting request along
    np.testing.assert_array_equal(high.outputs[0], np.zeros((1, 2)))


def test_delay_adapts_to_the_measured_run_time() -> None:
    async def main():
        b = _batcher(max_delay_ms=5.0)
        assert b.delay_s(4) == pytest.approx(0.005)  # nothing measured yet: max_delay_ms
        b.record(1, 0.001)
        b.record(4, 0.002)
        assert b.delay_s(1) == pytest.approx(0.001)  # a batch of 1 runs in 1 ms: wait no longer
        assert b.delay_s(8) == pytest.approx(0.004)  # unmeasured: scaled from the nearest size, 4
        b.record(4, 0.05)
        assert b.seconds[4] == pytest.approx(0.8 * 0.002 + 0.2 * 0.05)  # EWMA
        assert b.delay_s(4) == pytest.approx(0.005)  # capped by max_delay_ms
        fixed = _batcher(max_delay_ms=5.0, adaptive=False)
        fixed.record(1, 0.001)
        assert fixed.delay_s(1) == pytest.approx(0.005)
        # a lone request with a 1 s max delay but a 1 ms batch: served in about 1 ms, not 1 s
        slow = _batcher(max_delay_ms=1000.0)
        slow.record(1, 0.001)
        t0 = time.perf_counter()
        await slow.submit(np.ones((1, 2), np.float32))
        took = time.perf_counter() - t0
        # requests 50 ms apart, a 20 ms batch and a 1 s max delay: no company is expected, none is awaited
        lull = _batcher(max_delay_ms=1000.0)
        lull.record(1, 0.02)
        lull.gap_s = 0.05
        t1 = time.perf_counter()
        await lull.submit(np.ones((1, 2), np.float32))
        assert time.perf_counter() - t1 < 0.015
        for x in (b, fixed, slow, lull):
            await x.close()
        return took

    assert _run(main()) < 0.2


def test_busy_threads_make_the_next_batch_bigger() -> None:
    def slow(x: np.ndarray) -> list[np.ndarray]:
        time.sleep(0.1)
        return [x]

    async def main():
        b = _batcher(run=slow, slots=1, max_batch_size=64, max_delay_ms=0.0)
        first = asyncio.ensure_future(b.submit(np.zeros((1, 1), np.float32)))
        await asyncio.sleep(0.02)  # the first batch runs; these 20 queue meanwhile
        rest = await asyncio.gather(*(b.submit(np.full((1, 1), i, np.float32)) for i in range(20)))
        await first
        await b.close()
        return rest

    rest = _run(main())
    assert {r.batch_requests for r in rest} == {20}
    assert [float(r.outputs[0][0, 0]) for r in rest] == list(range(20))


def test_a_failing_model_fails_its_callers_not_the_batcher() -> None:
    def flaky(x: np.ndarray) -> list[np.ndarray]:
        if (x < 0).any():
            raise RuntimeError("negative input")
        return [x]

    async def main():
        b = _batcher(run=flaky, max_delay_ms=0.0)
        with pytest.raises(RuntimeError, match="negative input"):
            await b.submit(-np.ones((1, 1), np.float32))
        ok = await b.submit(np.ones((1, 1), np.float32))
        await b.close()
        return ok

    assert float(_run(main()).outputs[0][0, 0]) == 1.0


def test_one_bad_request_fails_alone_and_its_neighbours_are_answered() -> None:
    """A merged batch that fails runs again request by request: only the guilty one fails,
    with InputFailed (its input, not the model), and the others get their own rows."""
    runs: list[int] = []

    def picky(x: np.ndarray) -> list[np.ndarray]:
        runs.append(len(x))
        if (x == 999).any():
            raise IndexError("index 999 is out of bounds for dimension 0 with size 256")
        return [x * 2]

    async def main():
        b = _batcher(run=picky, max_batch_size=32, max_delay_ms=200, adaptive=False)
        xs = [np.full((1, 4), 999 if i == 5 else i, np.int64) for i in range(17)]
        results = await asyncio.gather(*(b.submit(x) for x in xs), return_exceptions=True)
        await b.close()
        return xs, results

    xs, results = _run(main())
    bad = results.pop(5)
    assert isinstance(bad, InputFailed) and "out of bounds" in str(bad)
    good = [x for i, x in enumerate(xs) if i != 5]
    for x, r in zip(good, results, strict=True):
        assert not isinstance(r, BaseException), r
        np.testing.assert_array_equal(r.outputs[0], x * 2)
    assert runs == [17] + [1] * 17  # the merged batch, then each request alone


def test_a_request_larger_than_a_batch_runs_as_several_and_is_joined_back() -> None:
    sizes: list[int] = []

    def record(x: np.ndarray) -> list[np.ndarray]:
        sizes.append(len(x))
        return [x + 1]

    async def main():
        b = _batcher(run=record, max_batch_size=8, max_delay_ms=0.0)
        x = np.arange(20 * 3, dtype=np.float32).reshape(20, 3)
        r = await b.submit(x)
        await b.close()
        return x, r

    x, r = _run(main())
    np.testing.assert_array_equal(r.outputs[0], x + 1)
    assert sorted(sizes) == [4, 8, 8] and r.batch_rows == 8


def test_a_full_queue_refuses_at_once_and_a_gone_caller_is_not_run() -> None:
    ran: list[float] = []

    def slow(x: np.ndarray) -> list[np.ndarray]:
        ran.extend(x[:, 0].tolist())
        time.sleep(0.2)
        return [x]

    async def main():
        b = _batcher(run=slow, slots=1, max_batch_size=2, max_delay_ms=0.0, max_queue_rows=4)
        first = asyncio.ensure_future(b.submit(np.zeros((2, 1), np.float32)))  # runs: the one slot busy
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(b.submit(np.ones((2, 1), np.float32)))  # held for the next batch
        await asyncio.sleep(0.01)
        queued = [asyncio.ensure_future(b.submit(np.full((2, 1), k, np.float32))) for k in (2, 3)]
        await asyncio.sleep(0.01)
        assert b.queued_rows == 4
        t0 = time.perf_counter()
        with pytest.raises(Overloaded, match=r"4 rows are queued \(serve.max_queue_rows=4\)"):
            await b.submit(np.full((1, 1), 9, np.float32))
        refused_in = time.perf_counter() - t0
        queued[1].cancel()  # its caller's deadline passed: it must not run
        await asyncio.gather(first, waiting, queued[0])
        await b.close()
        return refused_in

    assert _run(main()) < 0.05
    assert sorted(set(ran)) == [0.0, 1.0, 2.0]  # not 3 (cancelled), not 9 (refused)


class _Handle:
    terminate = False


def test_a_running_batch_is_stopped_when_its_last_caller_goes() -> None:
    """As onnxruntime's RunOptions: the run checks ``terminate`` between its steps."""
    steps: list[int] = []

    def long(x: np.ndarray, handle: _Handle) -> list[np.ndarray]:
        for step in range(500):  # 5 s unless stopped
            if handle.terminate:
                raise RuntimeError("Exiting due to terminate flag being set to true.")
            steps.append(step)
            time.sleep(0.01)
        return [x]

    async def main():
        b = _batcher(run=long, slots=1, max_batch_size=4, max_delay_ms=0.0, handles=_Handle)
        one, two = (asyncio.ensure_future(b.submit(np.zeros((1, 1), np.float32))) for _ in range(2))
        await asyncio.sleep(0.1)
        one.cancel()  # one caller left: the run goes on
        await asyncio.sleep(0.1)
        ran_on = len(steps)
        t0 = time.perf_counter()
        two.cancel()
        await b.close()  # returns once the run has stopped
        return ran_on, time.perf_counter() - t0

    ran_on, stopped_in = _run(main())
    assert ran_on >= 15 and stopped_in < 1.0 and len(steps) < 100, (ran_on, stopped_in, len(steps))
