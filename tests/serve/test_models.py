"""Finding an export by export id, run id or prefix, with one-line errors (export dirs made by the test)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fwk.errors import UserError
from fwk.serve.models import Loaded, Tensor, find_export


def _export(runs: Path, run: str, eid: str, created: str, passed: bool = True) -> None:
    d = runs / run / "exports" / eid
    d.mkdir(parents=True)
    (runs / run / "config.yaml").write_text("recipe: digits_cnn\n")
    (d / "fp32.onnx").write_bytes(b"onnx")
    report = {"recipe": "digits_cnn", "final": "fp32.onnx", "created": created, "verdict": {"passed": passed}}
    (d / "export_report.json").write_text(json.dumps(report))


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    _export(runs, "aaaa000001", "e111111111", "2026-01-01T00:00:00")
    _export(runs, "aaaa000001", "e122222222", "2026-01-03T00:00:00")
    _export(runs, "bbbb000002", "f333333333", "2026-01-02T00:00:00")
    _export(runs, "bbbb000002", "f444444444", "2026-01-04T00:00:00", passed=False)
    (runs / "cccc000003").mkdir()
    (runs / "cccc000003" / "config.yaml").write_text("recipe: digits_cnn\n")
    return runs


@pytest.mark.parametrize(
    "query,export",
    [
        ("e111111111", "e111111111"),  # an export id
        ("e11", "e111111111"),  # a unique prefix of one
        ("aaaa000001", "e122222222"),  # a run id: its newest export
        ("aaaa", "e122222222"),  # a unique prefix of a run id
        ("f3", "f333333333"),
    ],
)
def test_found(runs: Path, query: str, export: str) -> None:
    assert find_export(runs, query).id == export


@pytest.mark.parametrize(
    "query,message",
    [
        ("e1", "'e1' matches 2 ids (export e111111111 (run aaaa000001), export e122222222 (run aaaa000001))"),
        ("f4", "export f444444444 failed its verification"),
        ("cccc", "run cccc000003 has no exports; make one with `fwk export cccc000003`"),
        ("e1x", "no export or run 'e1x' under"),
        (None, "export f444444444 failed its verification"),  # the newest export is the failed one
    ],
)
def test_errors(runs: Path, query: str | None, message: str) -> None:
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        find_export(runs, query)


def test_unknown_names_the_closest(runs: Path) -> None:
    with pytest.raises(UserError) as err:
        find_export(runs, "e13")
    assert str(err.value).endswith("closest ids: e111111111, e122222222, f333333333")


def test_a_run_handle_stops_its_run_and_no_other(tmp_path: Path) -> None:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["input"], ["output"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    loaded = Loaded(None, session, Tensor("input", "FP32", "float32", (-1, 4)))
    batch = np.array([[-1.0, 0.0, 2.0, -3.0]], np.float32)
    stopped = Loaded.handle()
    stopped.terminate = True
    with pytest.raises(Exception, match="terminate"):
        loaded.run(batch, stopped)
    np.testing.assert_array_equal(loaded.run(batch, Loaded.handle())[0], [[0.0, 0.0, 2.0, 0.0]])
    np.testing.assert_array_equal(loaded.run(batch)[0], [[0.0, 0.0, 2.0, 0.0]])
