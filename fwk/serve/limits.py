"""What an export's graph says its integer input can take, read without the weights' data:

- ``ids``: the rows of the embedding table the input indexes (a Gather of an initializer,
  maybe through a DequantizeLinear in an int8 model): valid ids are 0..ids-1;
- ``longest``: per dimension, the most positions a learned position table has rows for (a
  Gather of a table by ``Range(0, size of that dimension)``); -1 where nothing bounds it.

An input outside these makes onnxruntime fail the whole batch, or first allocate in
proportion to it: ``protocol.parse`` refuses it with its own 400 instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

PASS_THROUGH = {"Cast", "Squeeze", "Unsqueeze", "Reshape", "Expand", "Identity"}  # same values, other form


@dataclass(frozen=True)
class Limits:
    ids: int | None  # None: the input indexes no table
    longest: tuple[int, ...]  # per dimension of the input; -1: unbounded


def read(model_file: Path, name: str, rank: int) -> Limits:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(model_file), load_external_data=False).graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    scalars = {t.name: t for t in graph.initializer if not t.dims}
    made_by = {out: node for node in graph.node for out in node.output}

    def source(tensor: str) -> Any:
        """Return the node that computes ``tensor``, past nodes that only reshape or cast it."""
        node = made_by.get(tensor)
        while node is not None and node.op_type in PASS_THROUGH:
            node = made_by.get(node.input[0])
        return node

    def table(gather: Any) -> int | None:
        data = gather.input[0]
        producer = made_by.get(data)
        if producer is not None and producer.op_type == "DequantizeLinear":
            data = producer.input[0]
        return int(shapes[data][0]) if data in shapes and len(shapes[data]) == 2 else None

    def dim_of(tensor: str) -> int | None:
        """Return the input dimension whose size ``tensor`` holds, as Shape(input)[k], if it
        holds one."""
        node = source(tensor)
        if node is None or node.op_type != "Shape" or node.input[0] != name:
            return None
        attrs = {a.name: a.i for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", rank)
        return start if end - start == 1 and 0 <= start < rank else None

    def zero(tensor: str) -> bool:
        return tensor in scalars and int(numpy_helper.to_array(scalars[tensor])) == 0

    ids, longest = None, [-1] * rank
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or (rows := table(node)) is None:
            continue
        if node.input[1] == name:
            ids = rows if ids is None else ids
            continue
        positions = source(node.input[1])
        if positions is None or positions.op_type != "Range" or not zero(positions.input[0]):
            continue
        k = dim_of(positions.input[1])
        if k is not None and k > 0:
            longest[k] = rows if longest[k] < 0 else min(longest[k], rows)
    return Limits(ids, tuple(longest))
