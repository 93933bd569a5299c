"""The image folder's fingerprint is cached per folder and recomputed when a folder changes."""

from __future__ import annotations

import os
from pathlib import Path

from fwk.data.fingerprint import of_image_folder
from fwk.data.sources import IMAGE_EXTENSIONS, of_files, walk
from tests.conftest import run_fwk


def _tree(root: Path, per_class: int = 3) -> Path:
    for split in ("train", "val"):
        for name in ("cat", "dog"):
            (root / split / name).mkdir(parents=True)
            for k in range(per_class):
                (root / split / name / f"{k}.jpg").write_bytes(b"\xff\xd8\xff" + bytes([k]) * 10)
    return root


def test_a_second_call_reads_the_cache_and_agrees_with_a_full_walk(tmp_path: Path) -> None:
    root = _tree(tmp_path / "data")
    first = of_image_folder(root)
    assert first.how.startswith("recomputed in ") and "(12 files), cached in " in first.how
    again = of_image_folder(root)
    assert again.how.startswith("from the cache (") and again.how.endswith("no folder changed since")
    files = [f for split in ("train", "val") for f in walk(root / split, IMAGE_EXTENSIONS)]
    assert first.digest == again.digest == of_files(root, files).digest
    assert first.what == again.what and "how" not in of_files(root, files).to_dict()


def test_an_added_removed_or_renamed_file_or_folder_recomputes(tmp_path: Path) -> None:
    root = _tree(tmp_path / "data")
    seen = {of_image_folder(root).digest}
    changes = [
        lambda: (root / "train" / "cat" / "new.jpg").write_bytes(b"\xff\xd8\xff new"),
        lambda: (root / "val" / "dog" / "0.jpg").unlink(),
        lambda: (root / "train" / "dog" / "1.jpg").rename(root / "train" / "dog" / "9.jpg"),
        lambda: (root / "val" / "emu").mkdir(),
    ]
    for change in changes:
        change()
        found = of_image_folder(root)
        assert found.how.startswith("recomputed"), found.how
        seen.add(found.digest)
    assert len(seen) == 4  # the empty emu/ adds no file: the last digest equals the one before it


def test_a_file_rewritten_in_place_is_seen_once_its_folder_is_touched(tmp_path: Path) -> None:
    root = _tree(tmp_path / "data")
    before = of_image_folder(root).digest
    image = root / "train" / "cat" / "0.jpg"
    image.write_bytes(b"\xff\xd8\xff other bytes, other size")
    assert of_image_folder(root).digest == before  # the documented limit: the folder's mtime did not move
    os.utime(image.parent)
    assert of_image_folder(root).digest != before


def test_dry_run_says_whether_the_fingerprint_was_recomputed(tmp_path: Path, runs: Path) -> None:
    root = _tree(tmp_path / "data")
    args = ["train", "data=imagefolder", f"data.root={root}", "model=resnet18", "--dry-run"]
    first = run_fwk(*args, runs=runs)
    assert first.returncode == 0, first.stderr
    assert "12 files" in first.stdout and "; recomputed in " in first.stdout
    second = run_fwk(*args, runs=runs)
    assert "; from the cache (" in second.stdout and "no folder changed since" in second.stdout
