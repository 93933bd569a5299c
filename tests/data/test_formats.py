"""Image formats: every extension torchvision's ImageFolder reads decodes to PIL's pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fwk.data import sources
from fwk.data.imagefolder import ImageFolderConfig, imagefolder
from fwk.data.images import decode_rgb
from fwk.errors import UserError

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")

# (extension, PIL format, save options, PIL mode written). Lossless formats must match PIL exactly.
LOSSLESS = [
    (".png", "PNG", {}, "RGB"),
    (".png", "PNG", {}, "RGBA"),  # alpha dropped, as convert("RGB") does
    (".webp", "WEBP", {"lossless": True}, "RGB"),
    (".bmp", "BMP", {}, "RGB"),
    (".ppm", "PPM", {}, "RGB"),
    (".pgm", "PPM", {}, "L"),  # grey: one channel repeated three times
    (".tif", "TIFF", {}, "RGB"),
    (".tiff", "TIFF", {}, "RGB"),
]


def _pixels(mode: str) -> Image.Image:
    rng = np.random.default_rng(0)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    array = rng.integers(0, 256, (29, 41, channels), dtype=np.uint8)  # odd sides: no lucky alignment
    return Image.fromarray(array.squeeze(-1) if channels == 1 else array, mode)


def _pil_rgb(path) -> torch.Tensor:
    with Image.open(path) as image:
        return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)


def test_extensions_are_torchvisions():
    from torchvision.datasets.folder import IMG_EXTENSIONS

    assert set(sources.IMAGE_EXTENSIONS) == set(IMG_EXTENSIONS)


@pytest.mark.parametrize("ext,fmt,options,mode", LOSSLESS, ids=[f"{e}-{m}" for e, _, _, m in LOSSLESS])
def test_lossless_formats_decode_exactly_as_pil(tmp_path, ext, fmt, options, mode):
    path = tmp_path / f"image{ext}"
    _pixels(mode).save(path, fmt, **options)
    got = decode_rgb(str(path))
    assert got.dtype == torch.uint8 and got.shape == (3, 29, 41)
    assert torch.equal(got, _pil_rgb(path))


def test_jpeg_decodes_close_to_pil(tmp_path):
    path = tmp_path / "image.jpg"
    _pixels("RGB").save(path, "JPEG", quality=90)
    got, want = decode_rgb(str(path)).int(), _pil_rgb(path).int()
    assert got.shape == want.shape == (3, 29, 41)
    # Both are libjpeg-turbo, but torchvision's build and PIL's may pick other IDCT / chroma
    # upsampling settings: a few levels of 255 apart on noise, never more.
    assert (got - want).abs().max() <= 8
    assert (got - want).abs().float().mean() < 1.0


def test_read_bytes_reads_what_torchvision_reads(tmp_path):
    from torchvision.io import read_file

    from fwk.data.images import read_bytes

    path = tmp_path / "image.jpg"
    _pixels("RGB").save(path, "JPEG", quality=90)
    assert torch.equal(read_bytes(str(path)), read_file(str(path)))
    (tmp_path / "empty.jpg").write_bytes(b"")
    assert read_bytes(str(tmp_path / "empty.jpg")).numel() == 0


def test_a_png_named_jpeg_is_read_by_its_bytes(tmp_path):
    path = tmp_path / "n02105855_2933.JPEG"  # ImageNet's train set has such a file
    _pixels("RGB").save(path, "PNG")
    assert torch.equal(decode_rgb(str(path)), _pil_rgb(path))


def test_a_folder_of_mixed_formats_is_one_data_set(tmp_path):
    for split, count in (("train", 2), ("val", 1)):
        for cls in ("a", "b"):
            folder = tmp_path / split / cls
            folder.mkdir(parents=True)
            for k, (ext, fmt, options, mode) in enumerate(LOSSLESS[: count * 3]):
                _pixels(mode).save(folder / f"{k}{ext}", fmt, **options)
            (folder / "notes.txt").write_text("not an image")
    bundle = imagefolder(ImageFolderConfig(root=str(tmp_path), image_size=16, val_resize=18), seed=0)
    assert len(bundle.train) == 12 and len(bundle.val) == 6
    assert all(bundle.train[i][0].shape == (3, 16, 16) for i in range(12))


def test_an_unreadable_file_names_itself(tmp_path):
    path = tmp_path / "broken.png"
    path.write_bytes(b"not an image at all")
    with pytest.raises(UserError) as err:
        decode_rgb(str(path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)
