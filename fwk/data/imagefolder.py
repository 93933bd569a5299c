"""ImageNet-layout image folders: ``root/train/<class>/*.JPEG`` and ``root/val/<class>/*.JPEG``.

JPEG is the fast path. PNG, WebP, BMP, PPM/PGM and TIFF files are read too, the extensions
of torchvision's ``ImageFolder``.

Augmentation is reproducible per item. Item ``i`` of epoch ``e`` draws its randomness from
a seed derived from ``(seed, e, i)``, so it is the same whatever the number of loader
workers and whichever worker loads it, and a resumed run sees the same crops.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import torch

from fwk.data.base import DataBundle
from fwk.data.configs import ImageFolderConfig, check_decode, check_layout, layout_hint
from fwk.data.images import JpegFolder
from fwk.data.registry import register_data
from fwk.data.sources import IMAGE_EXTENSIONS as EXTENSIONS
from fwk.errors import UserError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
Transform = Callable[[torch.Tensor], torch.Tensor]


class ToNormalizedFloat(torch.nn.Module):
    """The transform of a uint8 image (3, H, W) into float32 ``(x / 255 - mean) / std``.

    It computes ``x * (1 / (255 std)) + (-mean / std)``: one float copy, then a multiply and an
    add in place. ``ToDtype(scale=True)`` then ``Normalize`` take ~5x the time on a 64 px image,
    ~110 vs ~20 us. One ``addcmul`` takes ~2x at 224 px, ~110 vs ~50 us. The values differ by
    float rounding only, under 1e-6."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.mean, self.std = tuple(mean), tuple(std)
        m, s = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)  # (C, 1, 1)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {m.device: (1 / (255 * s), -m / s)}

    def extra_repr(self) -> str:  # env.json records the pipeline by its repr
        return f"mean={list(self.mean)}, std={list(self.std)}"

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        if image.device not in self._on:  # data.decode=gpu: copied to the GPU once, not per image
            scale, bias = next(iter(self._on.values()))
            self._on[image.device] = scale.to(image.device), bias.to(image.device)
        scale, bias = self._on[image.device]
        return image.to(torch.float32, copy=True).mul_(scale).add_(bias)  # copy: a float input stays the caller's


def train_transform(cfg: ImageFolderConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    from torchvision.transforms import v2  # torchvision is imported only by runs that use it

    from fwk.data.augment import CropFlip

    return v2.Compose(
        [
            # RandomResizedCrop + RandomHorizontalFlip in one step (fwk/data/augment.py),
            # while still uint8: 4x less memory traffic than on floats.
            CropFlip(cfg.image_size, scale=(cfg.min_scale, 1.0), p_flip=0.5 if cfg.hflip else 0.0),
            ToNormalizedFloat(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def val_transform(cfg: ImageFolderConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.Resize(cfg.val_resize, antialias=True),  # shorter side -> val_resize
            v2.CenterCrop(cfg.image_size),
            ToNormalizedFloat(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def _class_dirs(split_dir: str) -> list[str]:
    with os.scandir(split_dir) as entries:
        return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))


def _images(class_dir: str) -> list[str]:
    with os.scandir(class_dir) as entries:
        return sorted(e.name for e in entries if e.is_file() and os.path.splitext(e.name)[1].lower() in EXTENSIONS)


def _scan(root: str, split: str, class_index: dict[str, int]) -> tuple[list[str], list[int]]:
    """Return the relative paths '<class>/<file>' and their labels, sorted by class then file name."""
    split_dir = os.path.join(root, split)
    paths: list[str] = []
    labels: list[int] = []
    for name in _class_dirs(split_dir):
        if name not in class_index:
            raise UserError(
                f"data.root '{root}': class folder '{name}' is in {split}/ but not in train/; "
                f"{split}/ must use the class folders of train/ ({layout_hint(root)})"
            )
        files = _images(os.path.join(split_dir, name))
        paths += [f"{name}/{f}" for f in files]
        labels += [class_index[name]] * len(files)
    return paths, labels


def find_images(root: str) -> tuple[list[str], tuple[list[str], list[int]], tuple[list[str], list[int]]]:
    """Return the classes, then the paths and labels of train and of val.

    The classes are the sorted train folder names. A UserError, one line naming the path and
    the expected layout, says when the folder is missing, has no train or val images, or val
    has a class that train lacks.
    """
    root = check_layout(root)
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    classes = _class_dirs(train_dir)
    class_index = {name: i for i, name in enumerate(classes)}
    train = _scan(root, "train", class_index)
    if not train[0]:
        raise UserError(f"data.root '{root}' has no images in {train_dir}; {layout_hint(root)}")
    if not os.path.isdir(val_dir):
        raise UserError(f"data.root '{root}' has no val/ folder; {layout_hint(root)}")
    val = _scan(root, "val", class_index)
    if not val[0]:
        raise UserError(f"data.root '{root}' has no images in {val_dir}; {layout_hint(root)}")
    return classes, train, val


@register_data(ImageFolderConfig)
def imagefolder(cfg: ImageFolderConfig, *, seed: int) -> DataBundle:
    check_decode(cfg.decode)
    classes, (train_paths, train_labels), (val_paths, val_labels) = find_images(cfg.root)
    root = os.path.expanduser(cfg.root)
    random, fixed = train_transform(cfg), val_transform(cfg)
    train = JpegFolder(os.path.join(root, "train"), train_paths, train_labels, random, seed=seed, random=True)
    val = JpegFolder(os.path.join(root, "val"), val_paths, val_labels, fixed, seed=seed, random=False)
    bundle = DataBundle(
        train=train, val=val, task="classification", num_classes=len(classes), mean=IMAGENET_MEAN, std=IMAGENET_STD
    )
    return _on_gpu(bundle, random, fixed) if cfg.decode == "gpu" else bundle


def _on_gpu(bundle: DataBundle, random: Transform, fixed: Transform) -> DataBundle:
    """Make the bundle decode on the GPU for data.decode=gpu.

    Workers read bytes, and the training process decodes and augments on the GPU."""
    from fwk.data import gpu_decode

    if not torch.cuda.is_available():
        raise UserError("data.decode=gpu decodes with nvJPEG on a CUDA device, and there is none; use data.decode=cpu")
    return replace(
        bundle,
        train=gpu_decode.EncodedImages(bundle.train),  # type: ignore[arg-type]
        val=gpu_decode.EncodedImages(bundle.val),  # type: ignore[arg-type]
        collate=gpu_decode.collate,
        finish=gpu_decode.DecodeOnDevice(random, fixed),
    )
