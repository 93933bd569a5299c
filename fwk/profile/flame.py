"""Flame graphs as self-contained SVG, with no script and no server, and a tooltip per frame
(``<title>``).

Stacks come from the trace: the step, its part (``fwk.forward`` ...), the module hierarchy
(``features`` -> ``features.0 Conv2d``; a backward op sits under the module whose forward
it differentiates), then the ops. Time: each op's own time. Memory: the bytes each
allocation asked for, charged to the op (and so the layer) that made it.
"""

from __future__ import annotations

import bisect
import hashlib
from html import escape
from typing import Any

from fwk.profile.capture import MODULE_PREFIX
from fwk.profile.figures import _lineage, backward_modules, called_modules
from fwk.profile.trace import BACKWARD, Span, Trace

Stack = tuple[str, ...]

WIDTH, ROW, FONT = 1200, 17, 11


def _frames(span: Span, trace: Trace, seq_module: dict[int, str], types: dict[str, str], called: set[str]) -> list[str]:
    """Return the stack of ``span``, outermost first, with module names for module ranges and
    for backward ops."""
    chain = [*reversed(span.ancestors()), span]
    frames: list[str] = []
    if not chain[0].name.startswith("ProfilerStep#"):  # another thread (CUDA's autograd thread): say where
        frames += ["step", f"fwk.{trace.phase_at(span.start)}"]
    for s in chain:
        if s.name.startswith("ProfilerStep#"):
            frames.append("step")
        elif s.name.startswith(MODULE_PREFIX):
            name = s.name[len(MODULE_PREFIX) :]
            frames.append(f"{name} {types.get(name, '')}".strip())
        elif s.name.startswith(BACKWARD) and s.args.get("Sequence number") in seq_module:
            module = seq_module[s.args["Sequence number"]]
            frames += [f"{m} {types.get(m, '')}".strip() for m in _lineage(module) if m in called]  # child: the node
        else:
            frames.append(s.name)
    return frames


def time_stacks(trace: Trace, types: dict[str, str]) -> dict[Stack, float]:
    """Sum the microseconds per stack: host self time on a CPU, kernel time on CUDA."""
    seq_module, called = backward_modules(trace), called_modules(trace)
    stacks: dict[Stack, float] = {}
    for s in trace.spans:
        if not trace.in_steps(s.start):
            continue
        value = s.device_us if trace.on_device else s.self_us
        if value > 0:
            key = tuple(_frames(s, trace, seq_module, types, called))
            stacks[key] = stacks.get(key, 0.0) + value
    return stacks


def memory_stacks(trace: Trace, types: dict[str, str]) -> dict[Stack, float]:
    """Sum the bytes allocated per stack on the device that trained, CUDA if any, else CPU."""
    seq_module, called = backward_modules(trace), called_modules(trace)
    device_type = 1 if any(dev == 1 for *_, dev in trace.memory) else 0
    by_thread = {tid: sorted(spans, key=lambda s: s.start) for tid, spans in trace.threads.items()}
    starts = {tid: [s.start for s in spans] for tid, spans in by_thread.items()}
    stacks: dict[Stack, float] = {}
    for ts, nbytes, _, dev in trace.memory:
        if dev != device_type or nbytes <= 0 or not trace.in_steps(ts):
            continue
        owner = None  # the innermost span around the allocation, on any thread (the trace has no thread here)
        for tid, spans in by_thread.items():
            i = bisect.bisect_right(starts[tid], ts) - 1
            s = spans[i] if i >= 0 else None
            while s is not None and not s.start <= ts <= s.end:
                s = s.parent
            if s is not None and (owner is None or s.start > owner.start):
                owner = s
        key = (
            tuple(_frames(owner, trace, seq_module, types, called)) if owner is not None else ("step", "(outside ops)")
        )
        stacks[key] = stacks.get(key, 0.0) + nbytes
    return stacks


def _tree(stacks: dict[Stack, float]) -> dict[str, Any]:
    root: dict[str, Any] = {"name": "all", "value": 0.0, "children": {}}
    for stack, value in stacks.items():
        node = root
        node["value"] += value
        for frame in stack:
            node = node["children"].setdefault(frame, {"name": frame, "value": 0.0, "children": {}})
            node["value"] += value
    return root


def _color(name: str) -> str:
    if name in ("all", "step") or name.startswith("fwk."):
        return "#c8c8c8"
    h = int(hashlib.md5(name.encode()).hexdigest()[:4], 16)
    if "::" in name or name.endswith("Backward0") or name.startswith("Optimizer"):  # an op: warm colours
        return f"hsl({h % 50},{70 + h % 20}%,{58 + h % 10}%)"
    return f"hsl({200 + h % 30},{50 + h % 20}%,{62 + h % 10}%)"  # a module: blue


def svg(stacks: dict[Stack, float], title: str, unit: str) -> str:
    """Draw ``stacks`` as an icicle-style flame graph, with the whole at the top and callees below."""
    root = _tree(stacks)
    total = root["value"] or 1.0
    scale = WIDTH / total

    def fmt(v: float) -> str:
        if unit == "us":
            return f"{v / 1e3:.3f} ms"
        return f"{v / 2**20:.2f} MiB"

    rects: list[str] = []
    depth_max = 0

    def draw(node: dict[str, Any], x: float, depth: int) -> None:
        nonlocal depth_max
        w = node["value"] * scale
        if w < 0.3:
            return
        depth_max = max(depth_max, depth)
        y = 30 + depth * ROW
        label = f"{node['name']} — {fmt(node['value'])} ({node['value'] / total:.1%})"
        chars = int((w - 6) / (FONT * 0.6))
        text = node["name"] if len(node["name"]) <= chars else node["name"][: max(chars - 2, 0)] + ".."
        rects.append(
            f'<g><title>{escape(label)}</title><rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 1}" '
            f'fill="{_color(node["name"])}" rx="2"/>'
            + (f'<text x="{x + 3:.2f}" y="{y + ROW - 5}">{escape(text)}</text>' if chars >= 3 else "")
            + "</g>"
        )
        cx = x
        for child in sorted(node["children"].values(), key=lambda c: -c["value"]):
            draw(child, cx, depth + 1)
            cx += child["value"] * scale

    draw(root, 0.0, 0)
    height = 30 + (depth_max + 1) * ROW + 10
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="{FONT}">'
        f'<rect width="100%" height="100%" fill="#ffffff"/>'
        f'<text x="4" y="18" font-size="14">{escape(title)} (total {fmt(total)}; hover a frame for its figures)</text>'
    )
    return head + "".join(rects) + "</svg>\n"
