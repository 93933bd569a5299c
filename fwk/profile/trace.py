"""The Chrome trace of the profiled steps (what ``torch.profiler`` exports), read into spans.

``Trace.load`` keeps host ops (``cpu_op``), ``record_function`` ranges (``user_annotation``)
and Python functions as ``Span``s nested by time, GPU kernels linked to the op that launched
them (``External id``), and the ``[memory]`` events with the allocator's running total.
``fwk.profile.figures`` and ``fwk.profile.flame`` read their figures from it.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PHASES = ("data", "forward", "backward", "optimizer")
PHASE_LABELS = {f"fwk.{p}": p for p in PHASES}
_HOST = ("cpu_op", "user_annotation", "python_function")
_DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
BACKWARD = "autograd::engine::evaluate_function: "


@dataclass(eq=False)
class Span:
    name: str
    cat: str
    tid: Any
    start: float  # microseconds
    end: float
    args: dict[str, Any]
    parent: Span | None = None
    children: list[Span] = field(default_factory=list)
    device_us: float = 0.0  # kernels launched by this very op

    @property
    def dur(self) -> float:
        return self.end - self.start

    @property
    def self_us(self) -> float:
        return self.dur - sum(c.dur for c in self.children)

    def ancestors(self) -> list[Span]:
        out, s = [], self.parent
        while s is not None:
            out.append(s)
            s = s.parent
        return out


def _nest(spans: list[Span]) -> None:
    """Set parent/children of one thread's spans by time containment."""
    stack: list[Span] = []
    for s in sorted(spans, key=lambda s: (s.start, -s.dur)):
        while stack and not (s.start >= stack[-1].start and s.end <= stack[-1].end + 1e-3):
            stack.pop()
        if stack:
            s.parent = stack[-1]
            stack[-1].children.append(s)
        stack.append(s)


class Trace:
    """The spans, kernels and memory events of the recorded steps."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        threads: dict[Any, list[Span]] = defaultdict(list)
        kernels: list[dict[str, Any]] = []
        memory: list[tuple[float, int, int, int]] = []  # (ts, bytes, total allocated, device type)
        for e in events:
            cat, ph = e.get("cat"), e.get("ph")
            if ph == "X" and cat in _HOST:
                ts = float(e["ts"])
                span = Span(
                    e["name"], cat, (e.get("pid"), e.get("tid")), ts, ts + float(e.get("dur", 0)), e.get("args", {})
                )
                threads[span.tid].append(span)
            elif ph == "X" and cat in _DEVICE:
                kernels.append(e)
            elif ph == "i" and e.get("name") == "[memory]":
                a = e.get("args", {})
                memory.append(
                    (
                        float(e["ts"]),
                        int(a.get("Bytes", 0)),
                        int(a.get("Total Allocated", 0)),
                        int(a.get("Device Type", 0)),
                    )
                )
        for spans in threads.values():
            _nest(spans)
        self.threads = threads
        self.spans = [s for spans in threads.values() for s in spans]
        self.steps = sorted((s for s in self.spans if s.name.startswith("ProfilerStep#")), key=lambda s: s.start)
        self._step_starts = [s.start for s in self.steps]
        self.kernels = kernels
        by_ext = {s.args.get("External id"): s for s in self.spans if s.cat == "cpu_op" and "External id" in s.args}
        for k in kernels:
            op = by_ext.get(k.get("args", {}).get("External id"))
            if op is not None:
                op.device_us += float(k.get("dur", 0))
        self.on_device = any(k.get("cat") == "kernel" for k in kernels)
        self.memory = sorted(memory)
        # phase ranges of the main thread, sorted, for "which part of the step was this in"
        phases = sorted((s for s in self.spans if s.name in PHASE_LABELS), key=lambda s: s.start)
        self._phase_starts = [s.start for s in phases]
        self._phases = phases

    @classmethod
    def load(cls, path: Path) -> Trace:
        return cls(json.loads(Path(path).read_text())["traceEvents"])

    def in_steps(self, ts: float) -> bool:
        i = bisect.bisect_right(self._step_starts, ts) - 1
        return i >= 0 and ts <= self.steps[i].end

    def phase_at(self, ts: float) -> str:
        """Return the part of the step running at ``ts``, on any thread, since CUDA runs
        backward on its own."""
        i = bisect.bisect_right(self._phase_starts, ts) - 1
        if i >= 0 and ts <= self._phases[i].end:
            return PHASE_LABELS[self._phases[i].name]
        return "other"

    @property
    def step_us(self) -> float:
        return sum(s.dur for s in self.steps)

    def ops(self) -> list[Span]:
        return [s for s in self.spans if s.cat == "cpu_op" and self.in_steps(s.start)]

    def cost(self, op: Span) -> float:
        """Return an op's own time: its kernels' time on CUDA, its host self time on a CPU."""
        return op.device_us if self.on_device else op.self_us


# ---- operators ---------------------------------------------------------------------------
