"""`fwk data preview`, which draws the first training samples for a person, as the model will see them.

Images become a PNG grid with each label under its image. Text (``task="lm"``) becomes a
.txt file with each sample's input and target decoded. The samples come from the data
set the engine builds, in the order rank 0's ``TrainLoader`` draws them, augmentation
included. So a wrong crop, flip, normalization or label shows here before any training.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from fwk.data.base import DataBundle
from fwk.data.loader import TrainLoader
from fwk.data.loader_plan import LoaderPlan
from fwk.errors import UserError

MIN_SIDE = 32  # px: smaller images (the 8x8 digits) are upscaled by a whole factor to at least this
LABEL_H = 12  # px: the strip under each image that holds its label (PIL's default font is 10 px)
PADDING = 2  # px between tiles (make_grid's padding)


def first_samples(
    dataset: Dataset, n: int, batch_size: int, world_size: int, seed: int
) -> Iterator[tuple[int, Any, Any]]:
    """Yield the index, x and y of the first ``n`` training items rank 0 sees, in order.

    The order is ``TrainLoader``'s own sampler, epoch by epoch, with each epoch cut to whole
    batches (drop_last). ``set_epoch`` is called on the data set as the loader does, so an
    item's augmentation is the one training draws. Items are loaded one by one rather than
    as whole batches, so a preview of 64 ImageNet images need not decode a batch of 256.
    """
    loader = TrainLoader(dataset, batch_size, 0, world_size, seed, LoaderPlan())
    per_epoch = loader.batches_per_epoch * batch_size
    count = 0
    for epoch in itertools.count():
        loader.sampler.set_epoch(epoch)
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        for index in itertools.islice(iter(loader.sampler), per_epoch):
            x, y = dataset[index]
            yield index, x, y
            count += 1
            if count == n:
                return


def grid_shape(n: int) -> tuple[int, int]:
    """Return the columns and rows of a near-square grid of ``n`` tiles."""
    cols = math.ceil(math.sqrt(n))
    return cols, math.ceil(n / cols)


def _label_text(dataset: Dataset, index: int, label: Any) -> str:
    """Return the label, plus the class folder's name for data sets of files in class folders."""
    if isinstance(label, torch.Tensor) and label.numel() == 1:
        label = label.item()  # a TensorDataset's labels are 0-d tensors
    text = str(label)
    if hasattr(dataset, "path"):  # JpegFolder: <root>/<class>/<file>
        text += " " + os.path.basename(os.path.dirname(dataset.path(index)))
    return text


def _to_unit_range(x: torch.Tensor, mean: tuple[float, ...] | None, std: tuple[float, ...] | None) -> tuple:
    """Bring images (N, C, H, W) into [0, 1], and return them with how, for the printed line."""
    if mean is not None and std is not None:
        m = torch.tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)  # (1, C or 1, 1, 1)
        s = torch.tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
        return (x * s + m).clamp(0, 1), "un-normalized with the data set's mean/std"
    lo, hi = float(x.min()), float(x.max())
    if lo >= 0 and hi <= 1:
        return x, "pixel values as loaded"
    # The data set states no normalization: scale the whole batch at once (not each image)
    # so that images stay comparable with one another.
    return (x - lo) / max(hi - lo, 1e-12), f"values in [{lo:.3g}, {hi:.3g}] scaled to [0, 1] over the batch"


def image_grid(
    images: list[torch.Tensor], labels: list[str], mean: tuple[float, ...] | None, std: tuple[float, ...] | None
) -> tuple[Any, str]:
    """Draw the images in a near-square grid as a PIL image, each label in a strip under its image."""
    from PIL import Image, ImageDraw, ImageFont
    from torchvision.utils import make_grid

    x = torch.stack([torch.as_tensor(i, dtype=torch.float32) for i in images])
    if x.dim() == 3:  # (N, H, W): one channel
        x = x.unsqueeze(1)
    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise UserError(
            f"fwk data preview draws images of shape (C, H, W) with 1 or 3 channels, but this data set's "
            f"training items have shape {tuple(x.shape[1:])}"
        )
    x, how = _to_unit_range(x, mean, std)
    side = min(x.shape[-2:])
    if side < MIN_SIDE:
        # Nearest neighbour by a whole factor: each source pixel becomes a crisp square.
        x = F.interpolate(x, scale_factor=math.ceil(MIN_SIDE / side), mode="nearest")
    h, w = x.shape[-2:]
    x = F.pad(x, (0, 0, 0, LABEL_H))  # (N, C, H + LABEL_H, W): a black strip at the bottom
    cols, _ = grid_shape(len(images))
    grid = make_grid(x, nrow=cols, padding=PADDING, pad_value=0.5)  # (3, rows*(H+L+P)+P, cols*(W+P)+P)
    pixels = (grid * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()  # (H, W, 3)
    picture = Image.fromarray(pixels)
    draw = ImageDraw.Draw(picture)
    font = ImageFont.load_default()
    for k, text in enumerate(labels):
        row, col = divmod(k, cols)
        while len(text) > 1 and draw.textlength(text, font=font) > w - 2:
            text = text[:-1]  # cut long class names to the tile's width
        left = PADDING + col * (w + PADDING) + 1
        top = PADDING + row * (h + LABEL_H + PADDING) + h - 1  # the default font's glyphs start 2 px down
        draw.text((left, top), text, fill=(255, 255, 255), font=font)
    return picture, how


def _decode(tokens: Any) -> str:
    """Decode byte tokens as UTF-8 text, and other token ids as numbers.

    Undecodable bytes become U+FFFD."""
    ids = torch.as_tensor(tokens).flatten().tolist()
    if all(0 <= i < 256 for i in ids):
        return bytes(ids).decode("utf-8", errors="replace")
    return " ".join(str(i) for i in ids)


def write_text(samples: list[tuple[int, Any, Any]], path: Path, header: str) -> None:
    """Write each sample's input and target, decoded, one block after another."""
    blocks = [header]
    for k, (index, x, y) in enumerate(samples):
        blocks.append(
            f"=== sample {k} (train item {index}) ===\n"
            f"--- input ({torch.as_tensor(x).numel()} tokens) ---\n{_decode(x)}\n"
            f"--- target ({torch.as_tensor(y).numel()} tokens) ---\n{_decode(y)}\n"
        )
    path.write_text("\n".join(blocks), encoding="utf-8")


def preview(data: DataBundle, n: int, batch_size: int, world_size: int, seed: int, out_dir: Path) -> str:
    """Write a preview of the first ``n`` training samples under ``out_dir``, and return what it wrote."""
    samples = list(first_samples(data.train, n, batch_size, world_size, seed))
    whose = f"the first {len(samples)} training samples" + (f" of rank 0 (of {world_size})" if world_size > 1 else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    if data.task == "lm":
        path = out_dir / "train-samples.txt"
        header = (
            f"# fwk data preview: {whose}, in training order. Each: the input decoded as UTF-8 "
            "(undecodable bytes as U+FFFD), then its target (the tokens to predict).\n"
        )
        write_text(samples, path, header)
        return f"wrote {path}: {whose}, input and target decoded as text (text data: no PNG)"
    labels = [_label_text(data.train, index, y) for index, _, y in samples]
    picture, how = image_grid([x for _, x, _ in samples], labels, data.mean, data.std)
    path = out_dir / "train-samples.png"
    picture.save(path)
    cols, rows = grid_shape(len(samples))
    return (
        f"wrote {path} ({picture.width}x{picture.height} px): {whose} as training sees them, "
        f"augmentation included, in a grid of {cols}x{rows} with each label under its image ({how})"
    )
