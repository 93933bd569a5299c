"""The figures read from a hand-made trace: one step of a one-Linear model, with known times.

The CUDA variant adds kernels linked to their ops by ``External id``, as kineto writes them:
the device path is checked here without a GPU.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from fwk.profile import figures, flame
from fwk.profile.trace import Trace


def _x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _mem(ts: float, nbytes: int, total: int, device: int = 0) -> dict:
    args = {"Bytes": nbytes, "Total Allocated": total, "Device Type": device}
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts, "args": args}


def _events(cuda: bool) -> list[dict]:
    ann = "user_annotation"
    ev = [
        _x("ProfilerStep#3", 0, 1000, ann),
        _x("fwk.data", 0, 100, ann),
        _x("fwk.forward", 100, 300, ann),
        _x("fwk.module: <model>", 110, 280, ann),
        _x("fwk.module: fc", 120, 260, ann),
        _x("aten::linear", 130, 240, **{"Sequence number": 5, "External id": 1}),
        _x("aten::addmm", 140, 220, **{"Sequence number": 5, "External id": 2, "Input type": ["float"]}),
        _x("fwk.backward", 400, 400, ann),
        _x("autograd::engine::evaluate_function: AddmmBackward0", 410, 380, **{"Sequence number": 5}),
        _x("AddmmBackward0", 420, 360, **{"External id": 3}),
        _x("aten::mm", 430, 340, **{"External id": 4, "Input type": ["float"]}),
        _x("fwk.optimizer", 800, 150, ann),
        _x("aten::add_", 810, 130, **{"External id": 5}),
        _mem(150, 1000, 1000, 1 if cuda else 0),
        _mem(450, 3000, 4000, 1 if cuda else 0),
        _mem(900, -3000, 1000, 1 if cuda else 0),
    ]
    if cuda:
        ev += [
            _x("sgemm_fwd", 145, 50, "kernel", tid=7, **{"External id": 2}),
            _x("sgemm_bwd", 440, 80, "kernel", tid=7, **{"External id": 4}),
            _x("multi_tensor_apply", 820, 20, "kernel", tid=7, **{"External id": 5}),
        ]
    return ev


def test_cpu_figures() -> None:
    trace = Trace(_events(cuda=False))
    ops = figures.operators(trace)
    by_name = {r["name"]: r for r in ops["rows"]}
    # own (self) time: each op's duration less its children's
    assert by_name["aten::mm"]["self_ms_per_step"] == pytest.approx(0.340)
    assert by_name["aten::addmm"]["self_ms_per_step"] == pytest.approx(0.220)
    assert by_name["aten::linear"]["self_ms_per_step"] == pytest.approx(0.020)
    assert sum(r["share"] for r in ops["rows"]) == pytest.approx(1.0)
    assert ops["rows"][-1]["cumulative"] == pytest.approx(1.0)
    assert (ops["k"], ops["n"]) == (3, 6)  # mm 45%, addmm 29%, add_ 17%: 92% >= 80%

    split = {r["part"]: r["ms_per_step"] for r in figures.split(trace)["rows"]}
    assert split == pytest.approx(
        {"data": 0.1, "forward": 0.3, "backward": 0.4, "optimizer": 0.15, "communication": 0.0, "other": 0.05}
    )

    mods = {r["name"]: r for r in figures.modules(trace, {"<model>": "Net", "fc": "Linear"})["rows"]}
    assert mods["fc"]["forward_ms_per_step"] == pytest.approx(0.260)
    assert mods["fc"]["backward_ms_per_step"] == pytest.approx(0.380)  # matched by sequence number
    assert mods["<model>"]["backward_ms_per_step"] == pytest.approx(0.380)
    assert mods["fc"]["peak_mb"] == pytest.approx(4000 / 2**20)

    facts = figures.compute_facts(trace)
    assert facts["fp32_compute_share"] == pytest.approx((220 + 340) / 750)

    svg = flame.svg(flame.time_stacks(trace, {"<model>": "Net", "fc": "Linear"}), "t", "us")
    titles = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("fc Linear") for t in titles)
    assert any(t.startswith("aten::mm") for t in titles)


def test_cuda_figures_use_kernel_time() -> None:
    trace = Trace(_events(cuda=True))
    assert trace.on_device
    ops = figures.operators(trace)
    assert ops["basis"] == "device"
    assert [r["name"] for r in ops["rows"][:3]] == ["aten::mm", "aten::addmm", "aten::add_"]
    assert ops["rows"][0]["self_ms_per_step"] == pytest.approx(0.080)
    assert sum(r["share"] for r in ops["rows"]) == pytest.approx(1.0)

    split = {r["part"]: r["ms_per_step"] for r in figures.split(trace)["rows"]}
    assert split["forward"] == pytest.approx(0.050)
    assert split["backward"] == pytest.approx(0.080)
    assert split["optimizer"] == pytest.approx(0.020)
    assert split["data"] == pytest.approx(0.100)  # the host's wait for the loader
    assert split["other"] == pytest.approx(1.0 - 0.25)  # the device idles the rest of the step

    mods = {r["name"]: r for r in figures.modules(trace, {})["rows"]}
    assert mods["fc"]["forward_ms_per_step"] == pytest.approx(0.050)
    assert mods["fc"]["backward_ms_per_step"] == pytest.approx(0.080)
    mem = figures.memory(trace, device_memory_bytes=8000)
    assert mem["device"] == "cuda" and mem["peak_share"] == pytest.approx(0.5)


def test_uncalled_containers_get_no_backward() -> None:
    # blocks.0 lives in an nn.ModuleList "blocks", which has no forward of its own
    events = [{**e, "name": "fwk.module: blocks.0"} if e["name"] == "fwk.module: fc" else e for e in _events(False)]
    rows = {r["name"]: r for r in figures.modules(Trace(events), {})["rows"]}
    assert "blocks" not in rows
    assert rows["blocks.0"]["backward_ms_per_step"] == pytest.approx(0.380)
