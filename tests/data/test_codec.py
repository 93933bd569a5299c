"""Image decoding goes through TorchCodec: the same pixels as torchvision's deprecated
decoders, no deprecation warning per image, and torchvision's where TorchCodec cannot load."""

from __future__ import annotations

import io
import sys
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from fwk.data import codec
from fwk.data.images import decode_bytes


def _encoded(fmt: str) -> torch.Tensor:
    pixels = (np.random.default_rng(0).random((37, 50, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


@pytest.fixture
def fresh_decoders():
    codec.decoders.cache_clear()
    yield
    codec.decoders.cache_clear()


@pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_the_same_pixels_as_torchvision_and_no_warning(fmt: str, fresh_decoders: None) -> None:
    from torchvision.io import ImageReadMode, decode_image

    data = _encoded(fmt)
    expected = decode_image(data, mode=ImageReadMode.RGB)  # the reference: torchvision's (deprecated) decoder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [decode_bytes(data) for _ in range(3)]
    assert codec.decoders()[2] == "torchcodec"
    assert all(torch.equal(g, expected) for g in got) and got[0].shape == (3, 37, 50)
    assert [str(w.message) for w in caught] == []


def test_without_a_loadable_torchcodec_torchvisions_decoders_stay_quiet(
    monkeypatch: pytest.MonkeyPatch, fresh_decoders: None
) -> None:
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)  # import fails, as on a torch it was not built for
    data = _encoded("JPEG")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        got = decode_bytes(data)
        assert codec.decoders()[2] == "torchvision"
    assert got.shape == (3, 37, 50) and got.dtype == torch.uint8
    assert not [w for w in caught if "TorchVision are deprecated" in str(w.message)]


def test_a_truncated_jpeg_fails_as_torchcodec_says(fresh_decoders: None) -> None:
    data = _encoded("JPEG")[:40]
    with pytest.raises(RuntimeError):
        codec.decoders()[0](data)
