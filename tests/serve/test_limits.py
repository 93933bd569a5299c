"""Reading what an integer input can take from an ONNX graph built here: the embedding
table's rows (also through an int8 DequantizeLinear) and the position table's rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fwk.serve.limits import Limits, read


def _lm(path: Path, *, int8: bool, start: int = 0) -> Path:
    """ids (n, seq) -> token table[ids] + position table[Range(start, seq)], as torch's exporter writes it."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", "seq"])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", "seq", 8])
    inits = [
        numpy_helper.from_array(np.zeros((32, 8), np.float32), "pos"),
        numpy_helper.from_array(np.array(start, np.int64), "start"),
        numpy_helper.from_array(np.array(1, np.int64), "step"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    nodes = []
    if int8:
        inits += [
            numpy_helper.from_array(np.zeros((256, 8), np.int8), "tok_q"),
            numpy_helper.from_array(np.array(0.1, np.float32), "scale"),
        ]
        nodes.append(helper.make_node("DequantizeLinear", ["tok_q", "scale"], ["tok"]))
    else:
        inits.append(numpy_helper.from_array(np.zeros((256, 8), np.float32), "tok"))
    nodes += [
        helper.make_node("Gather", ["tok", "ids"], ["x"]),
        helper.make_node("Shape", ["ids"], ["seq1"], start=1, end=2),
        helper.make_node("Squeeze", ["seq1", "axis0"], ["seq"]),
        helper.make_node("Range", ["start", "seq", "step"], ["positions"]),
        helper.make_node("Gather", ["pos", "positions"], ["p"]),
        helper.make_node("Add", ["x", "p"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "lm", [ids], [out], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    onnx.checker.check_model(str(path))
    return path


def test_the_token_table_bounds_ids_and_the_position_table_bounds_the_sequence(tmp_path: Path) -> None:
    assert read(_lm(tmp_path / "fp32.onnx", int8=False), "ids", 2) == Limits(256, (-1, 32))
    assert read(_lm(tmp_path / "int8.onnx", int8=True), "ids", 2) == Limits(256, (-1, 32))


def test_positions_that_do_not_start_at_zero_and_other_inputs_bound_nothing(tmp_path: Path) -> None:
    model = _lm(tmp_path / "m.onnx", int8=False, start=1)
    assert read(model, "ids", 2) == Limits(256, (-1, -1))
    assert read(model, "other", 2) == Limits(None, (-1, -1))
