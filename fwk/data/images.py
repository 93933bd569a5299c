"""Reading image files, and the data set of one split's files.

``read_bytes`` reads a file's bytes, and ``decode_rgb`` and ``decode_bytes`` decode them to
uint8 RGB (3, H, W), whatever the format. ``JpegFolder`` is the data set of one split's
files, whose random transforms draw from a per-item seed (``seeded_cpu_rng``).
``imagefolder.py`` finds the files and builds the transforms. ``gpu_decode.py`` hands the
bytes to nvJPEG instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import accumulate

import torch
from torch.utils.data import Dataset

from fwk.data.base import item_seed
from fwk.errors import UserError


class JpegFolder(Dataset):
    """The (image, label) pairs of a list of image files, each image a normalized float32 (3, S, S).

    Paths are kept in one bytes blob plus an offsets tensor rather than a list of 1.3M Python
    strings. Forked loader workers touching each string's refcount would copy the pages one by
    one, until every worker holds its own copy of the list.
    """

    def __init__(
        self,
        root: str,
        paths: list[str],
        labels: list[int],
        transform: Callable[[torch.Tensor], torch.Tensor],
        *,
        seed: int,
        random: bool,
    ) -> None:
        encoded = [os.fsencode(p) for p in paths]  # fsencode: file names need not be UTF-8
        self.root = root
        self._blob = b"".join(encoded)
        self._offsets = torch.tensor([0, *accumulate(len(e) for e in encoded)], dtype=torch.int64)
        self.labels = torch.tensor(labels, dtype=torch.int64)
        self.transform = transform
        self.seed = seed
        self.random = random
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def path(self, index: int) -> str:
        start, end = self._offsets[index].item(), self._offsets[index + 1].item()
        return os.path.join(self.root, os.fsdecode(self._blob[start:end]))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = decode_rgb(self.path(index))  # (3, H, W) uint8
        if self.random:
            with seeded_cpu_rng(item_seed(self.seed, self.epoch, index)):
                image = self.transform(image)
        else:
            image = self.transform(image)
        return image, int(self.labels[index])


@contextmanager
def seeded_cpu_rng(seed: int) -> Iterator[None]:
    """Seed torch's global CPU generator with ``seed`` inside the context, and restore it outside.

    The transforms draw from that generator, so the seed set here must leak neither into the
    caller nor into the next item. ``torch.manual_seed`` would also queue a CUDA/XPU/MPS
    seeding and format a stack trace for it, at ~170-450 us a call. The CPU generator alone
    takes ~2 us and gives the same draws, as the CPU generator is all the transforms use.
    """
    generator = torch.default_generator
    state = generator.get_state()
    generator.manual_seed(seed)
    try:
        yield
    finally:
        generator.set_state(state)


# Formats TorchCodec decodes, by their first bytes (the file name can lie: ImageNet's
# train set holds a PNG named n02105855_2933.JPEG). JPEG is checked first: the fast path.
_JPEG = b"\xff\xd8\xff"
_CODEC_MAGIC = (b"\x89PNG", b"GIF8")


def decode_rgb(path: str) -> torch.Tensor:
    """Decode the image file at ``path`` to uint8 RGB (3, H, W), whatever its format."""
    data = read_bytes(path)
    try:
        return decode_bytes(data)
    except (RuntimeError, OSError) as exc:  # PIL's UnidentifiedImageError is an OSError
        reason = " ".join(str(exc).split())[:200]
        raise UserError(f"cannot decode image {path}: {reason}; replace or remove the file") from None


def read_bytes(path: str) -> torch.Tensor:
    """Return the file's bytes as a 1-D uint8 tensor, read with read(2) into the tensor.

    It does not use ``torchvision.io.read_file``, which maps the file into memory. The page
    faults and the unmap per image cost ~3x the system CPU time of a plain read, measured at
    ~29 vs ~10 us an image at 64 px. That is the main part of a loader worker's system time.
    """
    with open(path, "rb", buffering=0) as f:
        data = torch.empty(os.fstat(f.fileno()).st_size, dtype=torch.uint8)
        view, done = memoryview(data.numpy()), 0
        while done < len(view):  # read(2) may return less than asked
            got = f.readinto(view[done:])
            if not got:
                break
            done += got
    return data[:done]


def is_jpeg(data: torch.Tensor) -> bool:
    return data[:3].numpy().tobytes() == _JPEG


def decode_bytes(data: torch.Tensor) -> torch.Tensor:
    """Decode an encoded image, a 1-D uint8 tensor, to uint8 RGB (3, H, W).

    - JPEG is decoded by libjpeg-turbo (``codec.py``).
    - PNG, GIF and WebP are decoded by TorchCodec's ``decode_image``.
    - A binary RGB PPM, as ``fwk data prepare`` stores small images, is its bytes, viewed.
    - The other formats, such as BMP, PGM, TIFF and PPMs with comments, are read by PIL, as
      torchvision's own ``ImageFolder`` reads every file, with ``convert("RGB")``.
    """
    from fwk.data.codec import decoders

    decode_jpeg, decode_image, _ = decoders()
    head = data[:12].numpy().tobytes()
    if head.startswith(_JPEG):
        return decode_jpeg(data)
    if head.startswith(_CODEC_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        return decode_image(data)
    if head.startswith(b"P6"):
        raw = _raw_ppm(data)
        if raw is not None:
            return raw
    return _decode_pil(data)


def _raw_ppm(data: torch.Tensor) -> torch.Tensor | None:
    """Return a binary PPM of 8-bit RGB as a (3, H, W) view of its bytes, or None for other PPMs."""
    fields = data[:64].numpy().tobytes().split(maxsplit=4)  # b"P6", width, height, maxval, pixels
    if len(fields) < 4 or b"#" in b"".join(fields[:4]) or fields[3] != b"255":
        return None
    try:
        width, height = int(fields[1]), int(fields[2])
    except ValueError:
        return None
    start = len(data) - 3 * width * height
    if start <= 0 or not data[start - 1 : start].numpy().tobytes().isspace():
        return None
    return data[start:].view(height, width, 3).permute(2, 0, 1)


def _decode_pil(data: torch.Tensor) -> torch.Tensor:
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(data.numpy().tobytes())) as image:
        rgb = np.asarray(image.convert("RGB"))  # (H, W, 3)
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1)  # copy: asarray is read-only; (3, H, W) view
