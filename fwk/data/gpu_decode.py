"""Decoding images on the GPU, for ``data.decode=gpu``.

The loader workers only read the JPEG files. The training process decodes each batch at once
on the GPU, with nvJPEG through TorchCodec's ``decode_jpeg(list, device=)``, and crops, flips
and normalizes there.

Item ``i`` of epoch ``e`` gets the crop and flip it gets with ``decode=cpu``. The random
parameters are drawn from torch's CPU generator seeded per item (``seeded_cpu_rng``),
whichever device holds the pixels. Files that are not JPEG are decoded by the worker, on
the CPU, and join the batch as pixels.

The pieces run on any device, so the CPU tests check them against ``decode=cpu`` exactly:

- ``EncodedImages``, the worker's side.
- ``collate``, for batches of unequal-length bytes.
- ``DecodeOnDevice``, the training process's side, called by ``DevicePrefetcher``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import Dataset

from fwk.data.base import item_seed
from fwk.data.images import JpegFolder, decode_rgb, is_jpeg, read_bytes, seeded_cpu_rng

NO_SEED = -1  # an item of a data set without augmentation (validation): the fixed transform

# (encoded JPEG bytes (N,) or decoded pixels (3, H, W), per item), labels (B,), seeds (B,)
Encoded = tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]


class EncodedImages(Dataset):
    """The items of a ``JpegFolder`` before decoding: JPEG bytes or pixels, the label, and the seed."""

    def __init__(self, images: JpegFolder) -> None:
        self.images = images
        self.transform = images.transform  # applied by DecodeOnDevice; here for env.json's record

    def set_epoch(self, epoch: int) -> None:
        self.images.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        f = self.images
        path = f.path(index)
        data = read_bytes(path)
        if not is_jpeg(data):
            data = decode_rgb(path)  # PNG, WebP, BMP...: nvJPEG reads only JPEG
        seed = item_seed(f.seed, f.epoch, index) if f.random else NO_SEED
        return data, int(f.labels[index]), seed


def collate(items: list[tuple[torch.Tensor, int, int]]) -> Encoded:
    """Collate the items into a list of bytes, the labels and the seeds.

    The bytes stay a list, not a stack, since they differ in length."""
    data, labels, seeds = zip(*items, strict=True)
    return list(data), torch.tensor(labels), torch.tensor(seeds, dtype=torch.int64)


class DecodeOnDevice:
    """The decoder that turns an encoded batch into images and labels on the device.

    Called with the batch and the device, it returns float32 images (B, 3, S, S) and labels (B,)."""

    def __init__(self, random: Callable[[torch.Tensor], torch.Tensor], fixed: Callable[[torch.Tensor], torch.Tensor]):
        self.random, self.fixed = random, fixed

    def __call__(self, batch: Encoded, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        from fwk.data.codec import decoders

        decode_jpeg = decoders()[0]
        data, labels, seeds = batch
        jpegs = [i for i, d in enumerate(data) if d.dim() == 1]
        images = [d.to(device, non_blocking=True) if d.dim() == 3 else d for d in data]
        if jpegs:  # one call for the whole batch: nvJPEG decodes them together
            decoded = decode_jpeg([data[i] for i in jpegs], device=device)
            for i, image in zip(jpegs, decoded, strict=True):
                images[i] = image
        out = [self._transform(image, int(seed)) for image, seed in zip(images, seeds.tolist(), strict=True)]
        return torch.stack(out), labels.to(device, non_blocking=True)  # (B, 3, S, S), (B,)

    def _transform(self, image: torch.Tensor, seed: int) -> torch.Tensor:
        if seed == NO_SEED:
            return self.fixed(image)
        with seeded_cpu_rng(seed):  # the random draws are on the CPU generator, as with decode=cpu
            return self.random(image)
