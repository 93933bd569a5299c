"""Figures read from a Chrome trace of the profiled steps (what ``torch.profiler`` exports).

One source for everything: the trace holds host ops (``cpu_op``) with shapes, strides,
dtypes and autograd sequence numbers, ``record_function`` ranges (``user_annotation``:
``ProfilerStep#N``, the engine's ``fwk.data/forward/backward/optimizer`` and the module
ranges of ``capture.ModuleLabels``), GPU kernels linked to the op that launched them
(``External id``), and ``[memory]`` events with the allocator's running total.

Time is host time on a CPU and device (kernel) time on CUDA, where the host only queues
work. A backward op (``autograd::engine::evaluate_function: XBackward0``) carries the
sequence number of the forward op it differentiates, so it is charged to the module
whose forward ran that op.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from typing import Any

from fwk.profile.capture import MODULE_PREFIX, ROOT
from fwk.profile.trace import BACKWARD, PHASE_LABELS, PHASES, Span, Trace

_COMM = re.compile(r"^(nccl|gloo|c10d)[:_]|record_param_comms|^nccl", re.IGNORECASE)
_COMPUTE = re.compile(r"conv|addmm|matmul|\bmm\b|bmm|linear|::mm$|baddbmm|_scaled_dot_product", re.IGNORECASE)
_HALF = ("c10::BFloat16", "c10::Half")
SHORT_US = 20.0  # a call shorter than this is mostly launch or dispatch overhead
COVER = 0.8  # "k of n operators take 80% of the time"


def operators(trace: Trace) -> dict[str, Any]:
    """Rank the operators by own time, with shares and cumulative shares. Say how many of them,
    k of n, take 80%."""
    rows: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "self_us": 0.0, "host_us": 0.0})
    for op in trace.ops():
        row = rows[op.name]
        row["calls"] += 1
        row["self_us"] += trace.cost(op)
        row["host_us"] += op.self_us
    total = sum(r["self_us"] for r in rows.values()) or 1.0
    n_steps = max(len(trace.steps), 1)
    ranked = sorted(rows.items(), key=lambda kv: -kv[1]["self_us"])
    out, cumulative, k = [], 0.0, None
    for i, (name, r) in enumerate(ranked):
        share = r["self_us"] / total
        cumulative += share
        if k is None and cumulative >= COVER - 1e-9:
            k = i + 1
        out.append(
            {
                "name": name,
                "calls_per_step": r["calls"] / n_steps,
                "self_ms_per_step": r["self_us"] / n_steps / 1e3,
                "host_ms_per_step": r["host_us"] / n_steps / 1e3,
                "share": share,
                "cumulative": cumulative,
            }
        )
    n = sum(1 for r in out if r["self_ms_per_step"] > 0)
    return {"basis": "device" if trace.on_device else "host", "rows": out, "cover": COVER, "k": k or n, "n": n}


# ---- the step split ----------------------------------------------------------------------
def _is_comm(s: Span) -> bool:
    return bool(_COMM.search(s.name))


def split(trace: Trace) -> dict[str, Any]:
    """Split each step's time into data wait, forward, backward, optimizer, communication and
    other.

    CPU: host wall time of the engine's labels, communication ops taken out of the part
    they ran in. CUDA: kernel time launched in each part (data: the host's wait for the
    loader plus copies); ``other`` is what is left of the step: the device idle.
    """
    parts = dict.fromkeys((*PHASES, "communication"), 0.0)
    comm = [s for s in trace.ops() if _is_comm(s) and not any(_is_comm(a) for a in s.ancestors())]
    if trace.on_device:
        for op in trace.ops():
            if not op.device_us:
                continue
            if _is_comm(op) or any(_is_comm(a) for a in op.ancestors()):
                parts["communication"] += op.device_us
            else:
                phase = trace.phase_at(op.start)
                if phase in parts:  # kernels queued outside the labels stay in "other"
                    parts[phase] += op.device_us
        # the host's wait for the loader (the GPU idles through it unless work is queued)
        parts["data"] += sum(s.dur for s in trace.spans if s.name == "fwk.data" and trace.in_steps(s.start))
    else:
        for s in trace.spans:
            if s.name in PHASE_LABELS and trace.in_steps(s.start):
                parts[PHASE_LABELS[s.name]] += s.dur
        for s in comm:
            parts["communication"] += s.dur
            phase = trace.phase_at(s.start)
            if phase in parts:
                parts[phase] -= s.dur
    step = trace.step_us
    parts["other"] = max(step - sum(parts.values()), 0.0)
    whole = max(step, sum(parts.values())) or 1.0
    n_steps = max(len(trace.steps), 1)
    return {
        "basis": "device" if trace.on_device else "host",
        "step_ms": step / n_steps / 1e3,
        "rows": [{"part": p, "ms_per_step": v / n_steps / 1e3, "share": v / whole} for p, v in parts.items()],
    }


# ---- modules -----------------------------------------------------------------------------
def _module_of(span: Span) -> str | None:
    """Return the innermost module range around ``span``, or the span itself."""
    for s in [span, *span.ancestors()]:
        if s.name.startswith(MODULE_PREFIX):
            return s.name[len(MODULE_PREFIX) :]
    return None


def _lineage(name: str) -> list[str]:
    """Return the module names from the model down to ``name``: ``features.0`` ->
    ``[<model>, features, features.0]``."""
    if name == ROOT:
        return [ROOT]
    parts = name.split(".")
    return [ROOT] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def called_modules(trace: Trace) -> set[str]:
    """Return the modules whose forward ran. Containers never called, such as
    ``nn.ModuleList``, get no backward either."""
    return {s.name[len(MODULE_PREFIX) :] for s in trace.spans if s.name.startswith(MODULE_PREFIX)}


def backward_modules(trace: Trace) -> dict[int, str]:
    """Map each autograd sequence number to the module whose forward ran the op with that number."""
    seq_module: dict[int, str] = {}
    for s in trace.spans:
        seq = s.args.get("Sequence number")
        if s.cat == "cpu_op" and seq is not None and not s.name.startswith(BACKWARD) and seq not in seq_module:
            module = _module_of(s)
            if module is not None:
                seq_module[seq] = module
    return seq_module


def _peak(trace: Trace, device_type: int) -> tuple[list[float], list[int]]:
    events = [(ts, total) for ts, _, total, dev in trace.memory if dev == device_type]
    return [t for t, _ in events], [v for _, v in events]


def _span_total(span: Span, trace: Trace) -> float:
    return sum(op.device_us for op in _descendants(span)) if trace.on_device else span.dur


def _descendants(span: Span) -> list[Span]:
    out, todo = [], [span]
    while todo:
        s = todo.pop()
        out.append(s)
        todo.extend(s.children)
    return out


def modules(trace: Trace, types: dict[str, str]) -> dict[str, Any]:
    """Measure per module the forward time, the backward time and the peak memory allocated
    while either ran. The backward time counts its ops' gradients, and recomputation under
    activation checkpointing."""
    times: dict[str, dict[str, float]] = defaultdict(lambda: {"forward": 0.0, "backward": 0.0})
    windows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    seq_module = backward_modules(trace)
    called = called_modules(trace)
    for s in trace.spans:
        if not trace.in_steps(s.start):
            continue
        if s.name.startswith(MODULE_PREFIX):
            name = s.name[len(MODULE_PREFIX) :]
            phase = "backward" if trace.phase_at(s.start) == "backward" else "forward"  # recomputed in backward
            times[name][phase] += _span_total(s, trace)
            windows[name].append((s.start, s.end))
        elif s.name.startswith(BACKWARD) and not any(a.name.startswith(BACKWARD) for a in s.ancestors()):
            module = seq_module.get(s.args.get("Sequence number"))
            if module is None:
                continue
            cost = _span_total(s, trace)
            for name in (n for n in _lineage(module) if n in called):
                times[name]["backward"] += cost
                windows[name].append((s.start, s.end))
    device_type = 1 if any(dev == 1 for *_, dev in trace.memory) else 0
    stamps, totals = _peak(trace, device_type)
    n_steps = max(len(trace.steps), 1)
    rows = []
    for name, t in times.items():
        peak = 0
        for start, end in windows[name]:
            lo = max(bisect.bisect_left(stamps, start) - 1, 0)  # what was allocated on entry counts too
            hi = bisect.bisect_right(stamps, end)
            if hi > lo:
                peak = max(peak, max(totals[lo:hi]))
        rows.append(
            {
                "name": name,
                "type": types.get(name, "?"),
                "forward_ms_per_step": t["forward"] / n_steps / 1e3,
                "backward_ms_per_step": t["backward"] / n_steps / 1e3,
                "peak_mb": peak / 2**20,
            }
        )
    rows.sort(key=lambda r: -(r["forward_ms_per_step"] + r["backward_ms_per_step"]))
    return {
        "basis": "device" if trace.on_device else "host",
        "memory_device": "cuda" if device_type else "cpu",
        "rows": rows,
    }


def memory(trace: Trace, device_memory_bytes: int) -> dict[str, Any]:
    """Return the peak allocated memory over the recorded steps, against the device's memory."""
    device_type = 1 if any(dev == 1 for *_, dev in trace.memory) else 0
    _, totals = _peak(trace, device_type)
    peak = max(totals, default=0)
    allocated = sum(b for _, b, _, dev in trace.memory if dev == device_type and b > 0)
    n_steps = max(len(trace.steps), 1)
    return {
        "device": "cuda" if device_type else "cpu",
        "peak_mb": peak / 2**20,
        "device_mb": device_memory_bytes / 2**20,
        "peak_share": peak / device_memory_bytes if device_memory_bytes else 0.0,
        "allocated_mb_per_step": allocated / n_steps / 2**20,
    }


# ---- facts for the advice ----------------------------------------------------------------
def _is_nchw(dims: list[int], strides: list[int]) -> bool:
    if len(dims) != 4 or len(strides) != 4:
        return False
    n, c, h, w = dims
    return c > 1 and h * w > 1 and list(strides) == [c * h * w, h * w, w, 1]


def compute_facts(trace: Trace) -> dict[str, float]:
    """Return shares of op time: conv/matmul in fp32 and in bf16, NCHW convs under AMP, and
    calls under 20 µs."""
    ops = trace.ops()
    total = sum(trace.cost(op) for op in ops) or 1.0
    fp32 = bf16 = nchw_amp = 0.0
    short_time, short_calls, calls = 0.0, 0, 0
    for op in ops:
        cost = trace.cost(op)
        types, dims, strides = (
            op.args.get("Input type", []),
            op.args.get("Input Dims", []),
            op.args.get("Input Strides", []),
        )
        if cost and _COMPUTE.search(op.name) and types:
            if types[0] == "float":
                fp32 += cost
            if types[0] == "c10::BFloat16":
                bf16 += cost
            if "conv" in op.name and types[0] in _HALF and dims and strides and _is_nchw(dims[0], strides[0]):
                nchw_amp += cost
    if trace.on_device:
        durations = [float(k.get("dur", 0)) for k in trace.kernels if k.get("cat") == "kernel"]
    else:  # leaf ops: the calls that do the work themselves
        durations = [op.self_us for op in ops if not any(c.cat == "cpu_op" for c in op.children)]
    for d in durations:
        calls += 1
        if d < SHORT_US:
            short_calls += 1
            short_time += d
    n_steps = max(len(trace.steps), 1)
    return {
        "fp32_compute_share": fp32 / total,
        "bf16_compute_share": bf16 / total,
        "nchw_amp_conv_share": nchw_amp / total,
        "calls_per_step": calls / n_steps,
        "short_call_share": short_calls / calls if calls else 0.0,
        "short_time_share": short_time / (sum(durations) or 1.0),
    }


def startup(seconds: dict[str, float], memory: dict[str, float]) -> dict[str, Any]:
    """Return the profiled process's start-up, phase by phase: seconds and resident MiB added.

    They come from the run's summary (``fwk/track/startup.py``). This process composed the
    config, imported torch for its pre-flight checks, then started the profiler (``profiler``)
    and built the engine under it, so its seconds are a little longer than ``fwk train``'s;
    ``fwk runs show`` gives a trained run's own.
    """
    rows = [{"phase": phase, "seconds": s, "mib": memory.get(phase)} for phase, s in seconds.items()]
    total = sum(seconds.values())
    held = memory.get("at_first_step")
    line = f"start-up {total:.2f} s to the first step" + (f", {held:.0f} MiB resident then" if held else "")
    title = "Start-up of this process, phase by phase (under the profiler)"
    return {"rows": rows, "seconds_total": round(total, 3), "mib_at_first_step": held, "line": line, "title": title}
