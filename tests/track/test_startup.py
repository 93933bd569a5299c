"""fwk/track/startup.py: the phases of a start-up, from the process's start to the first step."""

import os
import subprocess
import sys
import time

import pytest

from fwk.track import startup


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A clock the test sets, a process that started at 100.0, and no marks of earlier tests."""
    now = [100.0]
    monkeypatch.setattr(startup.time, "time", lambda: now[0])
    monkeypatch.setattr(startup, "process_started", lambda: 100.0)
    monkeypatch.setattr(startup, "_marks", [])
    monkeypatch.setattr(startup, "_origin", [])
    monkeypatch.setattr(startup, "_resident", [])
    monkeypatch.setattr(startup, "_first", [])
    monkeypatch.setattr(startup, "_base", [])
    return now


def test_each_phase_lasts_from_the_mark_before_it(clock: list[float]) -> None:
    for phase, at in [("python", 100.2), ("config", 100.5), ("imports", 102.0), ("config", 102.1)]:
        clock[0] = at
        startup.mark(phase)
    assert startup.phases(until=102.4) == {"python": 0.2, "config": 0.4, "imports": 1.5, "other": 0.3}
    assert startup.phases() == {"python": 0.2, "config": 0.4, "imports": 1.5}


def test_the_next_run_counts_from_the_end_of_the_last(clock: list[float]) -> None:
    clock[0] = 101.0
    startup.mark("imports")
    clock[0] = 150.0
    startup.restart()
    clock[0] = 150.25
    startup.mark("data")
    assert startup.phases(until=151.0) == {"data": 0.25, "other": 0.75}


def test_the_process_start_is_read_from_the_kernel() -> None:
    # a child that sleeps before asking: its start lies that far back
    code = "import time; time.sleep(0.3); from fwk.track import startup; print(time.time() - startup.process_started())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert 0.3 <= float(out.stdout) < 3.0
    assert startup.process_started() <= time.time()


def test_each_phase_says_the_memory_it_added(clock: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    held = [0]
    monkeypatch.setattr(startup, "resident", lambda: held[0])
    for phase, mib in [("python", 20), ("imports", 400), ("data", 410), ("imports", 450)]:
        held[0] = mib * 2**20
        startup.mark(phase)
    held[0] = 500 * 2**20
    clock[0] = 103.0
    assert startup.first_step() == 103.0
    held[0], clock[0] = 900 * 2**20, 104.0
    assert startup.first_step() == 103.0  # only the first counts
    assert startup.memory() == {"python": 20.0, "imports": 420.0, "data": 10.0, "other": 50.0, "at_first_step": 500.0}
    held[0] = 600 * 2**20
    startup.restart()  # a sweep's next run in this process
    assert startup.memory() == {}
    held[0] = 610 * 2**20
    startup.mark("data")
    assert startup.memory() == {"data": 10.0}  # from where the last run ended, not from nothing


def test_the_resident_set_is_read_from_the_kernel() -> None:
    before = startup.resident()
    block = bytearray(64 * 2**20)  # touched: zero-filled pages are written
    assert startup.resident() - before >= 60 * 2**20
    del block
