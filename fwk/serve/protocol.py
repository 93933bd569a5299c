"""The Open Inference Protocol (KServe v2) request and response bodies, JSON and binary.

A request is JSON, or (the binary tensor extension, tritonclient's default) a JSON header
of ``Inference-Header-Content-Length`` bytes followed by the raw tensor bytes of each input
whose ``parameters.binary_data_size`` says so. A reply carries an output in binary when
the request asks for it (``outputs[i].parameters.binary_data``, or
``parameters.binary_data_output`` for all of them). Every mistake is a ``BadRequest``
naming what was expected; the app turns it into a 4xx with ``{"error": ...}``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fwk.serve.models import Tensor

HEADER_LENGTH = "Inference-Header-Content-Length"


class BadRequest(Exception):
    """A request the server cannot serve, with the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class InferRequest:
    id: str | None
    x: np.ndarray  # the one input, rows first
    high: bool  # parameters.priority "high" (or 1, Triton's highest): closes the batch at once
    client_id: str | None
    outputs: list[tuple[str, bool]] | None  # requested (name, binary); None: all outputs


def _wanted(t: Tensor) -> str:
    return f"'{t.name}' ({t.datatype}, shape {list(t.shape)}, -1: any size)"


def split(body: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    """Split the body into the JSON header, as a dict, and the binary tensor bytes after it."""
    if header_length is None:
        head, rest = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise BadRequest(f"{HEADER_LENGTH}: '{header_length}' is not a number of bytes") from None
        if not 0 <= n <= len(body):
            raise BadRequest(f"{HEADER_LENGTH}: {n} is outside the body's {len(body)} bytes")
        head, rest = body[:n], body[n:]
    try:
        req = json.loads(head)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the request body nests JSON too deeply; a v2 request is an object of flat lists") from None
    if not isinstance(req, dict):
        raise BadRequest('the request body must be a JSON object: {"inputs": [...]}')
    return req, rest


def client_id(req: dict[str, Any]) -> str | None:
    """Return ``parameters.client_id``. Requests with the same id go to the same version,
    canary or stable."""
    params = req.get("parameters")
    value = params.get("client_id") if isinstance(params, dict) else None
    return None if value is None else str(value)


def _params(where: dict[str, Any], what: str) -> dict[str, Any]:
    params = where.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise BadRequest(f"{what}'parameters' must be a JSON object, not {type(params).__name__}")
    return params


def parse(
    req: dict[str, Any], rest: bytes, model: str, want: Tensor, outputs: list[Tensor], max_rows: int | None = None
) -> InferRequest:
    """Check a v2 infer request against the model's one input before it joins a batch, and
    return the input as a numpy array. The check covers names, datatype, shape, size and the
    values: floats must be finite, and token ids ones the model has. With ``max_rows``, more
    rows is a 413 naming the limit."""
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, dict) for i in inputs):
        raise BadRequest(f"'inputs' must be a list of tensors; model {model} takes one input {_wanted(want)}")
    if len(inputs) != 1 or inputs[0].get("name") != want.name:
        got = ", ".join(repr(i.get("name")) for i in inputs)
        raise BadRequest(f"model {model} takes one input {_wanted(want)}; got {got}")
    (inp,) = inputs
    if inp.get("datatype") != want.datatype:
        raise BadRequest(f"input '{want.name}' has datatype {inp.get('datatype')!r}; expected {want.datatype}")
    shape = inp.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise BadRequest(f"input '{want.name}' needs a 'shape', a list of integers like {list(want.shape)}")
    same_rank = len(shape) == len(want.shape)
    fits = same_rank and all(w in (-1, d) and d >= 1 for d, w in zip(shape, want.shape, strict=True))
    if not fits:
        raise BadRequest(f"input '{want.name}' has shape {shape}; expected {list(want.shape)} (-1: any size >= 1)")
    if max_rows is not None and shape[0] > max_rows:
        raise BadRequest(
            f"input '{want.name}' has {shape[0]} rows; a request carries at most serve.max_request_rows={max_rows}: "
            "split it",
            413,
        )
    for k, (size, most) in enumerate(zip(shape, want.longest, strict=False)):  # () when none is known
        if 0 < most < size:  # a learned position table of ``most`` rows: more positions fail the model
            why = f"input '{want.name}' has {size} positions on dimension {k}; the model takes at most {most}"
            raise BadRequest(why)
    count = math.prod(shape)  # Python's integers: a product that overflows int64 stays huge, not 0
    params = _params(inp, f"input '{want.name}': ")
    if "binary_data_size" in params:
        size = params["binary_data_size"]
        need = count * np.dtype(want.dtype).itemsize
        if size != need or len(rest) != need:
            raise BadRequest(
                f"input '{want.name}': binary_data_size {size} with {len(rest)} bytes after the header; "
                f"shape {shape} of {want.datatype} needs {need}"
            )
        x = np.frombuffer(rest, dtype=want.dtype).reshape(shape)
    else:
        x = _array(inp, want, shape, count)
    _check_values(x, want)
    top = _params(req, "")
    names = {o.name for o in outputs}
    asked = None
    if req.get("outputs") is not None:
        if not isinstance(req["outputs"], list) or not all(isinstance(o, dict) for o in req["outputs"]):
            raise BadRequest("'outputs' must be a list of {\"name\": ...}")
        asked = [(o.get("name"), bool(_params(o, "an output's ").get("binary_data", False))) for o in req["outputs"]]
        for name, _ in asked:
            if name not in names:
                raise BadRequest(f"unknown output {name!r} of model {model}; its outputs: {', '.join(sorted(names))}")
    if asked is None and top.get("binary_data_output"):
        asked = [(o.name, True) for o in outputs]
    priority = top.get("priority")
    return InferRequest(req.get("id"), x, priority == "high" or priority == 1, client_id(req), asked)


def _array(inp: dict[str, Any], want: Tensor, shape: list[int], count: int) -> np.ndarray:
    """The JSON ``data`` as an array of ``shape``, flat (row-major) or nested in lists. Its
    values are counted against the shape's size first: numpy would copy every value of a
    huge list before its size could be compared, and the shape's size is what the row and
    position limits bound."""
    if "data" not in inp:
        raise BadRequest(f"input '{want.name}' has no 'data' (nor parameters.binary_data_size)")
    data = inp["data"]
    if not isinstance(data, list):
        raise BadRequest(
            f"input '{want.name}': data must be a list of {want.datatype} numbers, not {type(data).__name__}"
        )
    flat = not data or not isinstance(data[0], list)
    n = len(data) if flat else _count_values(data, count)
    if n != count:
        got = f"more than {count}" if n > count and not flat else n  # a nested count stops past the shape's
        raise BadRequest(f"input '{want.name}' has {got} values; shape {shape} needs {count}")
    try:
        x = np.asarray(data, dtype=want.dtype)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"input '{want.name}': data is not {want.datatype} numbers ({exc})") from None
    if x.size != count:  # kept: the count read the length of a row of values, not its items
        raise BadRequest(f"input '{want.name}' has {x.size} values; shape {shape} needs {count}")
    return x.reshape(shape)


_END = object()


def _count_values(data: list, most: int) -> int:
    """How many values nested ``data`` holds, its lists flattened (as Triton reads them); the
    count stops once past ``most``, so that a huge list costs no more than the size it is
    refused at. A list whose first item is not a list counts as a row of values, its length
    read without walking it: numpy refuses it later if it holds anything but numbers."""
    n, stack = 0, [iter(data)]
    while stack and n <= most:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif not isinstance(item, list):
            n += 1
        elif item and isinstance(item[0], list):
            stack.append(iter(item))
        else:
            n += len(item)
    return n


def _check_values(x: np.ndarray, want: Tensor) -> None:
    """Refuse what the model cannot take and would fail on, or poison its batch with: NaN or
    Inf, and token ids outside its embedding table."""
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise BadRequest(f"input '{want.name}' holds NaN or Inf values; send finite numbers")
    if want.ids is not None and x.size and (x.min() < 0 or x.max() >= want.ids):
        bad = int(x.min()) if x.min() < 0 else int(x.max())
        raise BadRequest(f"input '{want.name}' holds token id {bad}; the model takes ids 0..{want.ids - 1}")


def reply(
    model: str, version: str, request: InferRequest, tensors: list[Tensor], arrays: list[np.ndarray]
) -> tuple[bytes, dict[str, str]]:
    """Write the response body and its extra headers: JSON, or a JSON header then binary outputs."""
    by_name = {t.name: (t, a) for t, a in zip(tensors, arrays, strict=True)}
    wanted = request.outputs if request.outputs is not None else [(t.name, False) for t in tensors]
    outs, blobs = [], []
    for name, binary in wanted:
        t, a = by_name[name]
        entry: dict[str, Any] = {"name": name, "datatype": t.datatype, "shape": list(a.shape)}
        if binary:
            raw = np.ascontiguousarray(a).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = a.ravel().tolist()
        outs.append(entry)
    body: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": outs}
    if request.id is not None:
        body["id"] = request.id
    head = json.dumps(body).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return b"".join([head, *blobs]), {HEADER_LENGTH: str(len(head)), "content-type": "application/octet-stream"}
