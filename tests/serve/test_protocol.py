"""The v2 request parser on its own: a ``data`` list that does not fit its shape is refused
from its lengths, before numpy copies a value of it; one that fits, flat or nested, is the
array the shape says."""

from __future__ import annotations

import numpy as np
import pytest

from fwk.serve import protocol
from fwk.serve.models import Tensor
from fwk.serve.protocol import BadRequest

IMAGE = Tensor("input", "FP32", "float32", (-1, 1, 8, 8))
LOGITS = [Tensor("logits", "FP32", "float32", (-1, 10))]


def _request(data, shape=(1, 1, 8, 8)) -> dict:
    return {"inputs": [{"name": "input", "shape": list(shape), "datatype": "FP32", "data": data}]}


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of the lists numpy was asked to convert (np.asarray, as the parser calls it)."""
    seen: list[int] = []
    real = np.asarray

    def spy(a, *args, **kwargs):
        if isinstance(a, list):
            seen.append(len(a))
        return real(a, *args, **kwargs)

    monkeypatch.setattr(protocol.np, "asarray", spy)
    return seen


# a million values for a 64-value shape, flat and as rows; rows that do not fit the shape; 64 that do not nest right
OVERSIZED = [
    ([0.5] * 1_000_000, "has 1000000 values; shape [1, 1, 8, 8] needs 64"),
    ([[0.5] * 64] * 1_000_000, "has more than 64 values; shape [1, 1, 8, 8] needs 64"),
    ([[[[0.5] * 8] * 8]] * 2, "has more than 64 values; shape [1, 1, 8, 8] needs 64"),
    ([[0.5] * 32], "has 32 values; shape [1, 1, 8, 8] needs 64"),
]


@pytest.mark.parametrize("data,message", OVERSIZED, ids=["flat", "rows", "nested", "short"])
def test_data_that_does_not_fit_its_shape_is_refused_before_conversion(
    conversions: list[int], data: list, message: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        protocol.parse(_request(data), b"", "digits_cnn", IMAGE, LOGITS, max_rows=256)
    assert str(refused.value) == f"input 'input' {message}" and refused.value.status == 400
    assert conversions == []  # numpy never saw the list


@pytest.mark.parametrize(
    "data",
    [
        [0.25 * i for i in range(128)],  # flat, row-major
        [[[[0.25 * (64 * r + 8 * y + x) for x in range(8)] for y in range(8)]] for r in range(2)],  # nested as shaped
        [[0.25 * (64 * r + i) for i in range(64)] for r in range(2)],  # rows of flat values
    ],
    ids=["flat", "nested", "rows"],
)
def test_data_that_fits_is_the_array_of_its_shape(conversions: list[int], data: list) -> None:
    got = protocol.parse(_request(data, (2, 1, 8, 8)), b"", "digits_cnn", IMAGE, LOGITS, max_rows=256)
    assert got.x.shape == (2, 1, 8, 8) and got.x.dtype == np.float32
    assert np.array_equal(got.x.ravel(), np.arange(128, dtype=np.float32) * 0.25)
    assert conversions == [len(data)]


@pytest.mark.parametrize(
    "data,message",
    [
        ("0.5", "input 'input': data must be a list of FP32 numbers, not str"),
        ([0.5] * 63 + ["x"], "input 'input': data is not FP32 numbers (could not convert string to float: 'x')"),
        ([[0.5] * 32, [[0.5] * 32]], "input 'input': data is not FP32 numbers"),
    ],
    ids=["not-a-list", "a-string", "uneven"],
)
def test_data_of_the_right_size_but_not_numbers_is_one_line(data, message: str) -> None:
    with pytest.raises(BadRequest, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        protocol.parse(_request(data), b"", "digits_cnn", IMAGE, LOGITS, max_rows=256)
