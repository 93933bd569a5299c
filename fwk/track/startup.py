"""Start-up phases: how long this process took from its start to each point before its first step.

The launcher and the worker mark where each phase ends (``mark``), and the summary keeps
the phases' seconds (``phases``), so that ``summary.json`` says where a run's start-up went:
the interpreter and fwk's command line, the config, the run dir, the imports of torch and the
engine, then the data, the model, the strategies, the optimizer, the loaders and the
checkpoint. Under torchrun each worker is its own process and counts from its own start.

Each mark also reads the process's resident set, so that the summary says where the memory
held at the first step came from as well (``memory``): the interpreter and the libraries it
imported, the data, the model, the optimizer, and what each of fwk's phases added.
"""

from __future__ import annotations

import os
import time

_marks: list[tuple[str, float]] = []
_origin: list[float] = []  # where the next run's start-up begins, once this process trained one
_resident: list[tuple[str, int]] = []  # bytes resident at each mark
_first: list[tuple[float, int]] = []  # the first step's start: Unix time, bytes resident
_base: list[int] = []  # bytes resident where the next run's start-up begins, once this process trained one


def process_started() -> float:
    """Return the Unix time at which this process started.

    Linux gives a process's start in clock ticks since boot, which ``CLOCK_BOOTTIME`` counts
    too. Without /proc the first mark stands in for it.
    """
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, counted after the name
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return _marks[0][1] if _marks else time.time()


def resident() -> int:
    """Return the bytes this process holds in memory now (its resident set), 0 without /proc."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def mark(phase: str) -> None:
    """Note that ``phase`` ends now. The next phase starts here."""
    _marks.append((phase, time.time()))
    _resident.append((phase, resident()))


def first_step() -> float:
    """Note that the first step starts now, and return the Unix time. Only the first call counts."""
    if not _first:
        _first.append((time.time(), resident()))
    return _first[0][0]


def memory() -> dict[str, float]:
    """Return the MiB of resident memory each phase added, in the order they ran.

    The first phase counts from nothing, so it holds the interpreter. In a process that trains
    one run after another, the next run's counts from where the last one ended. The time from
    the last mark to the first step is ``other``, and ``at_first_step`` is the whole resident
    set then. A phase marked twice adds up. Without /proc it is empty.
    """
    if not any(held for _, held in _resident):
        return {}
    out: dict[str, float] = {}
    before = _base[-1] if _base else 0
    for phase, held in _resident:
        out[phase] = round(out.get(phase, 0.0) + (held - before) / 2**20, 1)
        before = held
    if _first and _first[0][1]:
        out["other"] = round((_first[0][1] - before) / 2**20, 1)
        out["at_first_step"] = round(_first[0][1] / 2**20, 1)
    return out


def phases(until: float | None = None) -> dict[str, float]:
    """Return each phase's seconds in the order they ran, from the process's start.

    The time after the last mark and before ``until`` (the first step, as a Unix time) is
    ``other``. A phase marked twice adds up.
    """
    out: dict[str, float] = {}
    before = _origin[-1] if _origin else process_started()
    for phase, at in _marks:
        out[phase] = round(out.get(phase, 0.0) + max(0.0, at - before), 3)
        before = at
    if until is not None and until > before:
        out["other"] = round(until - before, 3)
    return out


def restart() -> None:
    """Start counting the next run's start-up now, in a process that trains several one after another."""
    _marks.clear()
    _resident.clear()
    _first.clear()
    _origin[:] = [time.time()]
    _base[:] = [resident()]
