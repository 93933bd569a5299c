"""The config dataclasses of the registered data sets.

They are torch-free, so composing and validating a config never imports torch. Each builder
(fwk/data/<name>.py) takes its config from here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.config.methods import Rule
from fwk.data import sources
from fwk.data.registry import DATA
from fwk.data.sources import Fingerprint
from fwk.errors import UserError
from fwk.registry import doc


def side_rule(size: int, least: int = 1, why: str = "the side of a square image, in pixels") -> Rule:
    """The row of config/validate.py's checks for ``data.image_size``: a zero or negative side
    would fail deep in the first batch's resize or in the model's first layer."""
    return size >= least, "data.image_size", size, f"an integer >= {least} ({why})"


@DATA.register_config
@dataclass
class DigitsConfig:
    name: str = doc("digits", "registry name")
    val_size: int = doc(300, "number of images held out for validation")
    split_seed: int = doc(0, "seed of the train/val split; independent of the run's seed so the val set is fixed")
    normalize: bool = doc(True, "subtract the train pixels' mean and divide by their std (one scalar each)")
    image_size: int = doc(8, "side of the images in px: 8 (the originals) or larger, upscaled bilinearly (e.g. 32)")

    def rules(self, c: Any) -> Iterator[Rule]:
        yield side_rule(self.image_size, 8, "the digits are 8x8 px; larger sizes upscale them")

    def fingerprint(self) -> Fingerprint:
        return sources.of_content(sources.digits_file())


@DATA.register_config
@dataclass
class ImageFolderConfig:
    name: str = doc("imagefolder", "registry name")
    root: str = doc(
        "", "ImageNet-layout folder: root/train/<class>/*.JPEG, root/val/<class>/*.JPEG (or png, webp, bmp, ppm, tif)"
    )
    image_size: int = doc(224, "side of the square image fed to the model, in pixels")
    val_resize: int = doc(256, "validation: shorter side is resized to this before the center crop, in pixels")
    min_scale: float = doc(0.08, "train: smallest RandomResizedCrop area, as a fraction of the image area")
    hflip: bool = doc(True, "train: flip half of the images left-right")
    decode: str = doc(
        "cpu",
        "cpu: loader workers decode and augment; gpu: workers read the files, the training process decodes "
        "each batch's JPEGs at once with nvJPEG and augments on the GPU (CUDA only; same crops as cpu)",
    )

    def rules(self, c: Any) -> Iterator[Rule]:
        yield side_rule(self.image_size)

    def check(self) -> None:
        """Run the cheap checks the launcher runs before starting workers, without a scan of the files."""
        check_decode(self.decode)
        check_layout(self.root)

    def fingerprint(self) -> Fingerprint:
        """Return the fingerprint of the image files of train/ and val/: names, sizes, mtimes.

        It is cached while no folder changes."""
        from fwk.data.fingerprint import of_image_folder

        return of_image_folder(Path(check_layout(self.root)))


@DATA.register_config
@dataclass
class SyntheticConfig:
    name: str = doc("synthetic", "registry name")
    num_train: int = doc(1024, "number of training items")
    num_val: int = doc(256, "number of validation items")
    image_size: int = doc(224, "side of the square (3, S, S) images, in pixels")
    num_classes: int = doc(1000, "labels are drawn uniformly from [0, num_classes)")

    def rules(self, c: Any) -> Iterator[Rule]:
        yield side_rule(self.image_size)
        # 0 classes leaves no label to draw, and the model's num_classes would be asked to match it
        yield (
            self.num_classes >= 1,
            "data.num_classes",
            self.num_classes,
            "an integer >= 1 (labels are 0..num_classes-1)",
        )


@DATA.register_config
@dataclass
class StdlibTextConfig:
    name: str = doc("stdlib_text", "registry name")
    seq_len: int = doc(128, "tokens (bytes) per example; items are non-overlapping windows of this length")
    val_every: int = doc(20, "every val_every-th file of the sorted file list goes to val (>= 2)")
    max_bytes: int = doc(0, "cap on train bytes, taken from the start of the sorted concatenation (0 = no cap)")
    val_max_bytes: int = doc(262144, "cap on val bytes so evaluation stays quick (0 = no cap)")

    def fingerprint(self) -> Fingerprint:
        root = sources.stdlib_root()
        return sources.of_files(root, sources.source_files(root))


@DATA.register_config
@dataclass
class StreamingConfig:
    name: str = doc("streaming", "registry name")
    uri: str = doc("", "the prepared set (fwk data prepare): a folder, or s3://bucket/prefix")
    image_size: int = doc(224, "side of the square image fed to the model, in pixels")
    val_resize: int = doc(256, "validation: shorter side is resized to this before the center crop, in pixels")
    min_scale: float = doc(0.08, "train: smallest RandomResizedCrop area, as a fraction of the image area")
    hflip: bool = doc(True, "train: flip half of the images left-right")
    endpoint_url: str = doc("", "S3-compatible endpoint (MinIO, a local server); empty: AWS_ENDPOINT_URL, else AWS")
    cache_dir: str = doc("", "local cache of remote chunks; empty: $XDG_CACHE_HOME/fwk/streaming/<set>")
    max_cache_gb: float = doc(50.0, "size limit of that cache, in GB (older chunks are evicted)")

    def rules(self, c: Any) -> Iterator[Rule]:
        yield side_rule(self.image_size)

    def check(self) -> None:
        from fwk.data.shards import read_manifest

        read_manifest(self.uri, self.endpoint_url)

    def fingerprint(self) -> Fingerprint:
        """Return the fingerprint of the prepared set's manifest.

        The manifest holds its source's fingerprint and the prepare settings."""
        import hashlib
        import json

        from fwk.data.shards import describe, read_manifest

        manifest = read_manifest(self.uri, self.endpoint_url)
        keyed = {k: manifest[k] for k in ("source", "settings", "counts", "format")}
        digest = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]
        return Fingerprint(digest, f"prepared set {self.uri}: {describe(manifest)}")


def layout_hint(root: str) -> str:
    return (
        f"expected an ImageNet-layout folder: {root}/train/<class>/*.JPEG and "
        f"{root}/val/<class>/*.JPEG (set data.root=...)"
    )


def check_decode(decode: str) -> None:
    if decode not in ("cpu", "gpu"):
        raise UserError(
            f"data.decode={decode!r} is not allowed: expected one of cpu, gpu (fix it with data.decode=...)"
        )


def check_layout(root: str) -> str:
    """Return the expanded root if it is a folder with train/ and val/ folders, and raise UserError if not."""
    if not root:
        raise UserError(f"data.root is not set; {layout_hint('<root>')}")
    root = os.path.expanduser(root)
    if not os.path.isdir(root):
        raise UserError(f"data.root '{root}' is not a folder; {layout_hint(root)}")
    if not os.path.isdir(os.path.join(root, "train")):
        raise UserError(f"data.root '{root}' has no images (no train/ folder); {layout_hint(root)}")
    if not os.path.isdir(os.path.join(root, "val")):
        raise UserError(f"data.root '{root}' has no val/ folder; {layout_hint(root)}")
    return root


HF_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv", ".txt": "text"}


@DATA.register_config
@dataclass
class HFDataConfig:
    name: str = doc("hf", "registry name")
    path: str = doc(
        "",
        "local data read with Hugging Face datasets: a Parquet, JSON Lines, CSV or text file (or a glob of them), "
        "or a folder save_to_disk wrote",
    )
    text_column: str = doc("text", "the column holding the text")
    label_column: str = doc("", "empty: language modelling on the text; a column name: classify the text by it")
    tokenizer: str | None = doc(
        None,
        "bytes (byte level, no files), or a folder with a tokenizer; the default (null) is model.path's tokenizer "
        "under model=hf, else bytes",
    )
    seq_len: int = doc(128, "tokens per example: packed windows (language modelling), or truncated/padded texts")
    val_every: int = doc(20, "with no validation split in the data: every val_every-th text goes to val (>= 2)")
    val_max_tokens: int = doc(262144, "cap on val tokens (language modelling) so evaluation stays quick (0 = no cap)")
    streaming: bool = doc(
        False,
        "read the training texts as a stream (datasets' streaming=True), never all in memory: language modelling; "
        "resumes exactly on the same number of processes, at the next epoch on another",
    )
    shuffle_buffer: int = doc(10000, "streaming: texts in the shuffle buffer (datasets' buffer_size); 0 = file order")
    open_texts: int = doc(
        1024,
        "streaming: texts read at once; each row of a batch is the next window of one of them, drawn at random "
        "(more: batches nearer to random windows of the whole set, and more memory)",
    )

    def files(self) -> list[Path]:
        """Return the data files ``path`` names.

        For a save_to_disk folder these are its files, without the ``cache-*.arrow`` that
        datasets' own map writes beside them."""
        import glob

        where = Path(self.path).expanduser()
        if where.is_dir():
            return sorted(p for p in where.rglob("*") if p.is_file() and not p.name.startswith("cache-"))
        return sorted(Path(p) for p in glob.glob(str(where)))

    def check(self) -> None:
        if not self.path:
            raise UserError("data=hf needs data.path: a .parquet, .jsonl, .csv or .txt file, or a save_to_disk folder")
        where = Path(self.path).expanduser()
        if not where.is_dir() and not self.files():
            raise UserError(f"data.path={self.path} matches no file; give a .parquet, .jsonl, .csv or .txt file")
        if not where.is_dir():
            odd = sorted({p.suffix for p in self.files() if p.suffix not in HF_FORMATS})
            if odd:
                raise UserError(f"data.path={self.path}: files of type {odd[0]!r}; fwk reads {', '.join(HF_FORMATS)}")
        if self.seq_len < 1:
            raise UserError(f"data.seq_len={self.seq_len} must be >= 1")
        if self.val_every < 2:
            raise UserError(f"data.val_every={self.val_every} must be >= 2 (1 would leave no training texts)")
        if self.streaming and self.label_column:
            raise UserError(
                f"data.streaming=true streams text for language modelling; with data.label_column={self.label_column} "
                "set data.streaming=false (labelled texts are read whole)"
            )
        if self.open_texts < 1:
            raise UserError(f"data.open_texts={self.open_texts} must be >= 1 (the batch size is the least used)")
        if self.shuffle_buffer < 0:
            raise UserError(f"data.shuffle_buffer={self.shuffle_buffer} must be >= 0 (0: the files' order)")

    def fingerprint(self) -> Fingerprint:
        where = Path(self.path).expanduser()
        files = self.files()
        return sources.of_files(where if where.is_dir() else Path("/"), [f.resolve() for f in files])
