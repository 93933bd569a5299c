"""The verdict names the stage that lost accuracy; the recommendation follows measured speed."""

from __future__ import annotations

import copy
from typing import Any

from rich.console import Console

from fwk.export import report as rep


def _stage(name: str, acc: float, artifact: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "stage": name,
        "artifact": artifact,
        "val_acc": acc,
        "val_loss": 0.1,
        "drop": 0.0,
        "agreement": 1.0,
        "max_abs_diff": 1e-6,
        "rel_diff": 1e-7,
        "size_bytes": 4000,
        "weights": 1000,
        "samples": 300,
        **extra,
    }


def _latency(b1: float, b32: float) -> dict[str, dict[str, float]]:
    return {str(b): {"p50": v, "p90": v * 1.2, "min": v * 0.9, "max": v * 2} for b, v in ((1, b1), (32, b32))}


def _report(int8_acc: float = 0.98, fp32_ms=(2.0, 20.0), int8_ms=(1.0, 10.0)) -> dict[str, Any]:
    stages = [
        _stage(rep.TORCH, 0.99, latency_ms=_latency(4.0, 40.0)),
        _stage(rep.FOLDED, 0.99),
        _stage(rep.ONNX_FP32, 0.99, "fp32.onnx", latency_ms=_latency(*fp32_ms)),
        _stage("onnx int8", int8_acc, "int8.onnx", latency_ms=_latency(*int8_ms), size_bytes=1000),
    ]
    for s in stages:
        s["drop"] = rep.drop("classification", stages[0], s)
    report = {
        "export_id": "e",
        "parent_run": "r",
        "checkpoint": "step-00000100",
        "task": "classification",
        "quantize": "int8",
        "max_accuracy_drop": 1.0,
        "settings": {"fp32_rtol": 1e-4},
        "threads": 2,
        "cpu": {"capability": "AVX2", "vnni": False, "avx512": False, "amx": False},
        "stages": stages,
    }
    return report


def test_passes_within_the_limit() -> None:
    v = rep.verdict(_report(int8_acc=0.985))
    assert v == {"passed": True, "stage": None, "reason": "every stage's accuracy within 1 point of torch fp32"}


def test_names_the_stage_that_lost_accuracy() -> None:
    v = rep.verdict(_report(int8_acc=0.95))
    assert not v["passed"] and v["stage"] == "onnx int8"
    assert v["reason"] == (
        "stage 'onnx int8' lost 4.00 points of accuracy (99.00% -> 95.00% vs torch fp32), more than "
        "--max-accuracy-drop 1"
    )


def test_an_fp32_stage_that_differs_fails_first() -> None:
    report = _report(int8_acc=0.5)
    report["stages"][1]["rel_diff"] = 3e-3  # the folded model: an export bug, not rounding
    v = rep.verdict(report)
    assert v["stage"] == "folded" and "above export.fp32_rtol=0.0001" in v["reason"]


def test_language_model_drop_is_the_loss_rise_in_percent() -> None:
    report = _report()
    report["task"] = "lm"
    for s, loss in zip(report["stages"], (2.0, 2.0, 2.0, 2.1), strict=True):
        s["val_loss"] = loss
        s["drop"] = rep.drop("lm", {"val_loss": 2.0}, s)
    v = rep.verdict(report)
    assert v["stage"] == "onnx int8" and v["reason"].startswith(
        "stage 'onnx int8' raised the validation loss by 5.00% (loss 2.0000 -> loss 2.1000"
    )


def test_recommends_int8_only_where_it_is_faster() -> None:
    faster = rep.recommendation(_report(int8_ms=(1.0, 10.0)))
    assert faster["artifact"] == "int8.onnx" and "4.0x smaller" in faster["why"]
    slower = rep.recommendation(_report(int8_ms=(3.0, 30.0)))
    assert slower["artifact"] == "fp32.onnx"
    assert slower["why"].startswith("int8 is slower than ONNX fp32 on this CPU (AVX2, no VNNI)")
    mixed = rep.recommendation(_report(int8_ms=(3.0, 10.0)))
    assert mixed["artifact"] == "int8.onnx" and "slower at batch 1" in mixed["why"]
    assert "use fp32.onnx for batch 1" in mixed["why"]


def test_table_renders_every_stage() -> None:
    report = _report()
    report["verdict"], report["recommendation"] = rep.verdict(report), rep.recommendation(report)
    console = Console(width=200, record=True)
    console.print(rep.table(copy.deepcopy(report)))
    text = console.export_text()
    for name in ("torch fp32", "folded", "onnx fp32", "onnx int8", "int8.onnx", "98.00%", "2.00 / 2.40 (2.00x)"):
        assert name in text
