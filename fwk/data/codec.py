"""The image decoders fwk calls: TorchCodec's.

torchvision deprecated its image decoders in 0.29 in favour of TorchCodec's, and
``torchvision.io.decode_jpeg`` warns on every call. TorchCodec's give the same pixels at the
same speed, since both are libjpeg-turbo on the CPU and nvJPEG on CUDA. TorchCodec's compiled
ops are built for one torch release. Where they cannot load, with another torch, as on a
machine that keeps its own, torchvision's decoders are used instead. Their deprecation warning
is filtered, so that no run prints it per image.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

Decode = Callable[..., Any]


@functools.cache
def decoders() -> tuple[Decode, Decode, str]:
    """Return ``decode_jpeg(data | list, device=)``, ``decode_image(data)`` and which library they come from.

    Both decode to RGB uint8 images of shape (3, H, W)."""
    try:
        from torchcodec.decoders import decode_image, decode_jpeg

        decode_jpeg(_TINY_JPEG)  # the compiled ops load here, not at import
    except Exception:  # noqa: BLE001 - any failure to load means: use torchvision's
        return (*_torchvision(), "torchvision")

    def jpeg(data: Any, device: str | torch.device = "cpu") -> Any:
        return decode_jpeg(data, mode="RGB", device=device)

    def image(data: torch.Tensor) -> torch.Tensor:
        return decode_image(data, mode="RGB")

    return jpeg, image, "torchcodec"


def _torchvision() -> tuple[Decode, Decode]:
    warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    def jpeg(data: Any, device: str | torch.device = "cpu") -> Any:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)

    def image(data: torch.Tensor) -> torch.Tensor:
        return decode_image(data, mode=ImageReadMode.RGB)

    return jpeg, image


# a 1x1 grey JPEG (PIL, quality 50): what decoders() decodes to learn whether TorchCodec's ops load
_TINY_JPEG = torch.frombuffer(
    bytearray(
        bytes.fromhex(
            "ffd8ffe000104a46494600010100000100010000ffdb004300100b0c0e0c0a100e0d0e1211101318281a181616183123251d"
            "283a333d3c3933383740485c4e404457453738506d51575f626768673e4d71797064785c656763ffc0000b08000100010101"
            "1100ffc4001f0000010501010101010100000000000000000102030405060708090a0bffc400b51000020103030204030505"
            "04040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a"
            "25262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475767778797a8384858687"
            "88898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2"
            "e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffda0008010100003f002bffd9"
        )
    ),
    dtype=torch.uint8,
)
