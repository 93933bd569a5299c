"""The training augmentation of image folders in one step: random resized crop and flip.

torchvision's ``v2.RandomResizedCrop`` then ``v2.RandomHorizontalFlip`` cost ~240 us an image
at 64 px on one core, where the resize itself takes ~50 us. The rest goes to the v2 dispatch,
which flattens the inputs and asks each transform whether it applies, and to six small tensors
drawn one by one for the crop's parameters. ``CropFlip`` samples the crop as
``RandomResizedCrop`` does, from one draw of the CPU generator: area uniform in ``scale``, log
aspect ratio uniform in ``ratio``, ten tries, then the central crop. It resizes the uint8 crop
with torchvision's resize kernel (``resize_image``, bilinear and antialiased), called directly,
without the v2 dispatch.
"""

from __future__ import annotations

import math

import torch
from torchvision.transforms.v2.functional import resize_image

_TRIES = 10  # RandomResizedCrop's attempts before it falls back to the central crop


def crop_box(height: int, width: int, u: list[float], scale: tuple[float, float], ratio: tuple[float, float]):
    """Return the crop's top, left, height and width from uniform draws ``u``.

    It chooses them as ``RandomResizedCrop.make_params`` does. ``u`` holds 2 draws per try, then
    2 for the position."""
    area = height * width
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for k in range(_TRIES):
        target = area * (scale[0] + (scale[1] - scale[0]) * u[2 * k])
        aspect = math.exp(lo + (hi - lo) * u[2 * k + 1])
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = min(int(u[2 * _TRIES] * (height - h + 1)), height - h)
            left = min(int(u[2 * _TRIES + 1] * (width - w + 1)), width - w)
            return top, left, h, w
    aspect = width / height  # no try fitted: the whole image, cut to the nearest allowed ratio
    if aspect < min(ratio):
        w, h = width, round(width / min(ratio))
    elif aspect > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class CropFlip(torch.nn.Module):
    """A random resized crop to ``size`` x ``size`` and a left-right flip with probability ``p_flip``.

    Both come from one draw of torch's CPU generator, which the data set seeds per item."""

    def __init__(
        self,
        size: int,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        p_flip: float = 0.5,
    ) -> None:
        super().__init__()
        if not 0 < scale[0] <= scale[1] or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"scale {scale} and ratio {ratio} must be increasing pairs of positive numbers")
        self.size, self.scale, self.ratio, self.p_flip = size, tuple(scale), tuple(ratio), p_flip

    def extra_repr(self) -> str:  # env.json records the pipeline by its repr
        ratio = tuple(round(r, 4) for r in self.ratio)
        return f"size={self.size}, scale={self.scale}, ratio={ratio}, p_flip={self.p_flip}"

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        u = torch.rand(2 * _TRIES + 3).tolist()  # the tries, the position, the flip
        top, left, h, w = crop_box(image.shape[-2], image.shape[-1], u, self.scale, self.ratio)
        out = resize_image(image[..., top : top + h, left : left + w], [self.size, self.size], antialias=True)
        return out.flip(-1) if u[-1] < self.p_flip else out
