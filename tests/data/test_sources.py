"""Data fingerprints: what enters the run id, and that it changes when the data does."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from fwk.data import sources
from fwk.data.configs import DigitsConfig, ImageFolderConfig, StdlibTextConfig, SyntheticConfig
from fwk.errors import UserError
from fwk.launch.launcher import data_fingerprint


def _tree(root: Path) -> None:
    for split, cls, name in [("train", "cat", "a.JPEG"), ("train", "dog", "b.jpg"), ("val", "cat", "c.jpeg")]:
        (root / split / cls).mkdir(parents=True, exist_ok=True)
        (root / split / cls / name).write_bytes(b"x" * 10)
    (root / "train" / "cat" / "notes.txt").write_text("not an image")


def test_digits_fingerprint_is_the_sha256_of_the_data_file() -> None:
    fp = DigitsConfig().fingerprint()
    path = sources.digits_file()
    assert path.name == "digits.csv.gz" and path.is_file()
    assert fp.digest == hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert str(path) in fp.what


def _walked(root: Path) -> sources.Fingerprint:
    """The image folder's fingerprint by a full walk (what its cache keeps: tests/data/test_fingerprint.py)."""
    files = [f for split in ("train", "val") for f in sources.walk(root / split, sources.IMAGE_EXTENSIONS)]
    return sources.of_files(root, files)


def test_image_folder_fingerprint_follows_names_sizes_and_mtimes(tmp_path: Path) -> None:
    _tree(tmp_path)
    cfg = ImageFolderConfig(root=str(tmp_path))
    first = cfg.fingerprint()
    assert (first.digest, first.what) == (_walked(tmp_path).digest, _walked(tmp_path).what)  # the cache agrees
    assert first.what.startswith("3 files, 30 B under")  # the .txt file is not data
    (tmp_path / "train" / "cat" / "notes.txt").write_text("edited")
    assert _walked(tmp_path) == sources.Fingerprint(first.digest, first.what)  # not an image: no change
    image = tmp_path / "val" / "cat" / "c.jpeg"
    os.utime(image, ns=(1, 1))
    touched = _walked(tmp_path)
    assert touched.digest != first.digest
    image.write_bytes(b"y" * 11)
    assert _walked(tmp_path).digest not in (first.digest, touched.digest)
    image.rename(tmp_path / "val" / "cat" / "d.jpeg")
    assert cfg.fingerprint().what.startswith("3 files, 31 B")  # a rename moves the folder's mtime: recomputed


def test_image_folder_fingerprint_of_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is not a folder"):
        ImageFolderConfig(root=str(tmp_path / "nope")).fingerprint()


def test_walk_is_sorted_by_relative_path_and_prunes(tmp_path: Path) -> None:
    for rel in ["b/x.py", "a/y.py", "a/__pycache__/z.py", "c.py", "d.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("1")
    found = [p.relative_to(tmp_path).as_posix() for p in sources.source_files(tmp_path)]
    assert found == ["a/y.py", "b/x.py", "c.py"]


def test_stdlib_text_fingerprint_lists_the_stdlib_sources() -> None:
    fp = StdlibTextConfig().fingerprint()
    n = len(sources.source_files(sources.stdlib_root()))
    assert n > 100 and fp.what.startswith(f"{n:,} files")


def test_synthetic_and_custom_data_say_why_there_is_no_digest() -> None:
    assert data_fingerprint(SyntheticConfig()) == {"digest": "", "what": "generated from the data config"}
    custom = data_fingerprint(SimpleNamespace(name="custom", _target_="my_pkg.Data"))
    assert custom["digest"] == "" and "cannot see" in custom["what"]
