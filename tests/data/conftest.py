"""The streaming tests' set: a tiny image folder prepared once per test file (fwk data
prepare), and moto's S3 server on loopback holding it at ``s3://data/sets/toy``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fwk.data.configs import ImageFolderConfig
from fwk.data.prepare import prepare
from tests.conftest import require
from tests.s3server import CREDENTIALS, loopback_s3, server_path, upload

CLASSES = ("cat", "dog", "emu")
S3_URI = "s3://data/sets/toy"


def _folder(root: Path) -> Path:
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    for split, count in (("train", 12), ("val", 3)):
        for name in CLASSES:
            (root / split / name).mkdir(parents=True)
            for k in range(count):
                pixels = torch.randint(0, 256, (50, 70, 3), dtype=torch.uint8, generator=gen).numpy()
                Image.fromarray(pixels).save(root / split / name / f"{k}.JPEG", quality=95)
    return root


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the image folder, its prepared set): 36 train and 9 val images, two chunks a split."""
    base = tmp_path_factory.mktemp("streaming")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(base / "cache"))
        source = _folder(base / "images")
        # two workers: two chunks a split, so that a reader has a chunk left to fetch after a fork
        line = prepare(ImageFolderConfig(root=str(source)), str(base / "shards"), 32, 90, 2, 0)
        assert len(list((base / "shards" / "val").glob("chunk-*.bin"))) == 2
        assert line.startswith(f"prepared {base / 'shards'}: 36 train / 9 val images, shorter side <= 32 px")
        yield source, base / "shards"


@pytest.fixture(scope="module")
def moto(prepared: tuple[Path, Path]) -> Iterator[str]:
    """The endpoint of moto's S3 server on loopback, the prepared set uploaded by the normal S3 client."""
    require(server_path().is_file(), "moto_server is needed (pip install 'moto[server]')")
    with loopback_s3() as endpoint:
        upload(endpoint, prepared[1], "data", "sets/toy")
        yield endpoint


@pytest.fixture(scope="module")
def s3(moto: str) -> dict[str, str]:
    """The environment that points S3 clients at it."""
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": moto}


def use_s3(s3: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The test's processes talk to the loopback server only: its credentials, no AWS files, no instance metadata."""
    for key, value in s3.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
