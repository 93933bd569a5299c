"""fwk data prepare and data=streaming's set: shards written once (locally and to a real
S3-compatible server on loopback, moto's), read back, refused in one line. Training from
them: test_streaming_loader.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fwk.data.configs import ImageFolderConfig, StreamingConfig
from fwk.data.prepare import MARKER, prepare
from fwk.data.shards import MANIFEST
from fwk.errors import UserError
from tests.conftest import run_fwk
from tests.data.conftest import CLASSES, use_s3
from tests.s3server import upload

# the refusals are decided before any training: a tiny config
TRAIN = ["data=streaming", "model=small_cnn", "model.in_channels=3", "model.num_classes=3"]


def test_prepare_writes_smaller_jpegs_their_labels_and_a_manifest(prepared: tuple[Path, Path]) -> None:
    from litdata import StreamingDataset

    _, shards = prepared
    manifest = json.loads((shards / MANIFEST).read_text())
    assert manifest["counts"] == {"train": 36, "val": 9} and manifest["classes"] == list(CLASSES)
    assert manifest["settings"] == {"max_side": 32, "quality": 90, "raw_max_side": 0, "chunk_mb": 64}
    assert len(manifest["source"]["digest"]) == 16
    assert not (shards / MARKER).exists()
    items = StreamingDataset(str(shards / "val"))
    item = items[0]
    image = torch.frombuffer(bytearray(item["image"]), dtype=torch.uint8)
    from fwk.data.images import decode_bytes

    assert image[:3].tolist() == [0xFF, 0xD8, 0xFF]  # a JPEG
    decoded = decode_bytes(image)
    assert decoded.shape == (3, 32, 45)  # 50 x 70 -> shorter side 32, aspect kept
    assert sorted(items[i]["label"] for i in range(9)) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    train = StreamingDataset(str(shards / "train"))
    written = [train[i]["index"] for i in range(36)]  # litdata shuffles within chunks only: the order is mixed here
    assert sorted(written) == list(range(36)) and written != sorted(written)
    assert {train[i]["label"] for i in range(12)} == {0, 1, 2}  # not the folder's first class alone


def test_small_images_are_stored_uncompressed_and_read_back_exactly(
    prepared: tuple[Path, Path], tmp_path: Path
) -> None:
    import numpy as np
    from litdata import StreamingDataset
    from PIL import Image

    from fwk.data.images import decode_bytes

    source, _ = prepared
    out = tmp_path / "raw"
    line = prepare(ImageFolderConfig(root=str(source)), str(out), 32, 90, 1, 45)
    assert "JPEG quality 90 (uncompressed up to 45 px)" in line
    first = StreamingDataset(str(out / "val"))[0]
    assert bytes(first["image"][:2]) == b"P6"
    with Image.open(source / "val" / CLASSES[first["label"]] / "0.JPEG") as original:
        small = original.convert("RGB").resize((45, 32), Image.Resampling.BICUBIC, reducing_gap=3.0)
    expected = torch.from_numpy(np.asarray(small).copy()).permute(2, 0, 1)
    got = decode_bytes(torch.frombuffer(bytearray(first["image"]), dtype=torch.uint8))
    assert got.shape == (3, 32, 45) and torch.equal(got, expected)


def test_a_rerun_finds_it_other_settings_are_refused_and_an_interrupted_one_restarts(
    prepared: tuple[Path, Path], tmp_path: Path, said: pytest.LogCaptureFixture
) -> None:
    source, shards = prepared
    cfg = ImageFolderConfig(root=str(source))
    assert prepare(cfg, str(shards), 32, 90, 1, 0).startswith(f"already prepared: {shards} (36 train / 9 val")
    with pytest.raises(UserError, match=f"^--out {shards} holds another prepared set"):
        prepare(cfg, str(shards), 48, 90, 1)
    half = tmp_path / "half"
    shutil.copytree(shards, half)
    (half / MANIFEST).unlink()
    (half / MARKER).write_text("{}")
    said.clear()
    assert prepare(cfg, str(half), 32, 90, 1, 0).startswith("prepared ")
    assert said.messages[0] == f"{half}: an interrupted prepare; starting it again" and (half / MANIFEST).is_file()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="is not empty and holds no fwk prepare; choose an empty or new folder$"):
        prepare(cfg, str(tmp_path / "other"), 32, 90, 1)


def test_streamed_items_are_seeded_per_item_and_validation_reads_every_image(prepared: tuple[Path, Path]) -> None:
    from fwk.data.streaming import streaming

    _, shards = prepared
    bundle = streaming(StreamingConfig(uri=str(shards), image_size=16, val_resize=18), seed=3)
    assert bundle.num_classes == 3 and len(bundle.val) == 9 and bundle.train_loader is not None
    image, label = bundle.val[4]
    assert image.shape == (3, 16, 16) and image.dtype == torch.float32 and label in (0, 1, 2)
    assert torch.equal(bundle.train[5][0], bundle.train[5][0])  # the same item, epoch and seed: the same crop


@pytest.mark.parametrize(
    ("uri", "setting", "line"),
    [
        ("s3://nobucket/sets/toy", {}, "data.uri=s3://nobucket/sets/toy: bucket 'nobucket' does not exist at"),
        (
            "s3://data/sets/none",
            {},
            "data.uri=s3://data/sets/none holds no prepared set (fwk-manifest.json is missing)",
        ),
        ("s3://data/sets/toy", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "data.uri=s3://data/sets/toy: cannot reach"),
        ("s3://data/sets/toy", {"AWS_ACCESS_KEY_ID": ""}, "data.uri=s3://data/sets/toy: no S3 credentials found"),
    ],
)
def test_a_set_that_cannot_be_read_is_one_line_before_any_run_dir(
    s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uri: str, setting: dict[str, str], line: str
) -> None:
    use_s3(s3, monkeypatch, tmp_path)
    for key, value in setting.items():
        if value:
            monkeypatch.setenv(key, value)
        else:
            monkeypatch.delenv(key)
    out = run_fwk("train", *TRAIN, f"data.uri={uri}", "--dry-run", runs=tmp_path / "runs")
    assert out.returncode == 2 and out.stderr.startswith(f"fwk: error: {line}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_a_local_set_of_another_format_is_refused(prepared: tuple[Path, Path], tmp_path: Path) -> None:
    _, shards = prepared
    old = tmp_path / "old"
    shutil.copytree(shards, old)
    manifest = json.loads((old / MANIFEST).read_text())
    (old / MANIFEST).write_text(json.dumps({**manifest, "format": 1, "fwk": "0.1.0"}))  # class-sorted items
    out = run_fwk("train", *TRAIN, f"data.uri={old}", "--dry-run", runs=tmp_path / "runs")
    assert out.returncode == 2 and out.stderr.strip() == (
        f"fwk: error: data.uri={old} was prepared by fwk 0.1.0 in format 1, this fwk reads format 2; prepare it "
        "again with this fwk (fwk data prepare)"
    )


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_set_whose_index_declares_a_pickled_field_is_refused_before_any_run_dir(
    prepared: tuple[Path, Path],
    moto: str,
    s3: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """litdata unpickles a field that index.json declares "pickle" in every loader worker:
    whoever can write the set's folder or bucket would run code on every node."""
    _, shards = prepared
    bad = tmp_path / "pickled"
    shutil.copytree(shards, bad)
    index = json.loads((bad / "train" / "index.json").read_text())
    config = index["config"]
    assert config["types"] == {"image": "bytes", "index": "int", "label": "int"}  # what fwk data prepare writes
    config["types"]["label"] = "pickle"
    config["data_format"][json.loads(json.loads(config["data_spec"])[1]["context"]).index("label")] = "pickle"
    (bad / "train" / "index.json").write_text(json.dumps(index))
    uri = str(bad)
    if where == "s3":
        use_s3(s3, monkeypatch, tmp_path)
        uri = upload(moto, bad, "data", "sets/pickled")
    out = run_fwk("train", *TRAIN, f"data.uri={uri}", "train.max_steps=2", runs=tmp_path / "runs")
    assert out.returncode == 2 and out.stderr == (
        f"fwk: error: data.uri={uri}: train/index.json reads field 'label' with litdata's 'pickle' serializer, "
        "which fwk does not read (it could run code: only bytes, int, as fwk data prepare writes); prepare the "
        "set again with fwk data prepare\n"
    ), out.stderr
    assert not (tmp_path / "runs").exists()


def test_a_cached_index_that_declares_a_pickled_field_is_refused(
    prepared: tuple[Path, Path], moto: str, s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """litdata reads a remote split's index.json from its cache once it is there, not from the
    server: whoever can write data.cache_dir could name "pickle" where the server's index is clean."""
    from fwk.data.streaming import streaming

    _, shards = prepared
    use_s3(s3, monkeypatch, tmp_path)
    uri = upload(moto, shards, "data", "sets/cached")
    cfg = StreamingConfig(uri=uri, cache_dir=str(tmp_path / "cache"), image_size=16, val_resize=18)
    assert streaming(cfg, seed=0).num_classes == 3  # fetches both splits' index.json into the cache
    cached = sorted((tmp_path / "cache").rglob("index.json"))
    assert len(cached) == 2  # train's and val's, each under a hash of its URL
    for path in cached:
        index = json.loads(path.read_text())
        config = index["config"]
        config["types"]["label"] = "pickle"
        config["data_format"][json.loads(json.loads(config["data_spec"])[1]["context"]).index("label")] = "pickle"
        path.write_text(json.dumps(index))
    said = rf"^data.uri={uri} \(cached in .*\): train/index.json reads field 'label' .* delete "
    with pytest.raises(UserError, match=said):
        streaming(cfg, seed=0)
    for path in cached:
        path.write_text("not json")
    with pytest.raises(UserError, match=r"is not a litdata index; delete it"):
        streaming(cfg, seed=0)


def test_prepare_leaves_the_processs_start_method_as_it_was(prepared: tuple[Path, Path], tmp_path: Path) -> None:
    import multiprocessing

    before = multiprocessing.get_start_method(allow_none=True)
    prepare(ImageFolderConfig(root=str(prepared[0])), str(tmp_path / "again"), 32, 90, 1, 0)
    assert multiprocessing.get_start_method(allow_none=True) == before  # litdata sets spawn; loaders fork


def test_prepare_to_s3_uploads_then_finds_it_and_refuses_other_settings(
    s3: dict[str, str], prepared: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    from fwk.data.publish import staging_dir
    from fwk.data.shards import read_manifest

    use_s3(s3, monkeypatch, tmp_path)
    source, _ = prepared
    args = ["data", "prepare", "data=imagefolder", f"data.root={source}", "--max-side", "32", "--workers", "1"]
    uri = "s3://data/sets/direct"
    out = run_fwk(*args, "--out", uri, runs=tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith(f"prepared {uri}: 36 train / 9 val images, shorter side <= 32 px"), last
    assert "uploading " in out.stdout and read_manifest(uri)["counts"] == {"train": 36, "val": 9}
    client = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
    keys = {o["Key"] for o in client.list_objects_v2(Bucket="data", Prefix="sets/direct/")["Contents"]}
    assert {"sets/direct/fwk-manifest.json", "sets/direct/train/index.json", "sets/direct/val/index.json"} <= keys
    assert "sets/direct/.fwk-preparing" not in keys and not staging_dir(uri).exists()  # done: nothing left behind
    # again, in this process (the command's path is the one above): found; other settings refused
    cfg = ImageFolderConfig(root=str(source))
    assert prepare(cfg, uri, 32, 90, 1).startswith(f"already prepared: {uri} (36 train / 9 val")
    with pytest.raises(UserError, match=f"^--out {uri} holds another prepared set"):
        prepare(cfg, uri, 48, 90, 1)


def test_an_upload_cut_short_leaves_no_manifest_and_a_rerun_uploads_without_encoding_again(
    s3: dict[str, str],
    prepared: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    said: pytest.LogCaptureFixture,
) -> None:
    from boto3.exceptions import S3UploadFailedError

    from fwk.data import shards
    from fwk.data.publish import staging_dir

    use_s3(s3, monkeypatch, tmp_path)
    cfg, uri = ImageFolderConfig(root=str(prepared[0])), "s3://data/sets/cut"
    real, sent = shards.s3_client, []

    def failing(*a: object) -> tuple:
        client, *rest = real(*a)

        def upload_file(path: str, bucket: str, key: str) -> None:
            if len(sent) == 3:
                raise S3UploadFailedError("Failed to upload: An error occurred (AccessDenied) when calling PutObject")
            sent.append(key)
            client.__class__.upload_file(client, path, bucket, key)

        client.upload_file = upload_file
        return (client, *rest)

    monkeypatch.setattr(shards, "s3_client", failing)
    with pytest.raises(UserError, match=f"^--out={uri}: S3 refused an upload \\(Failed to upload: An error"):
        prepare(cfg, uri, 32, 90, 1, 0)
    assert len(sent) == 3 and not any(k.endswith(MANIFEST) for k in sent)
    assert shards.s3_manifest(uri, "") is None and (staging_dir(uri) / MANIFEST).is_file()  # encoded, kept
    monkeypatch.setattr(shards, "s3_client", real)
    said.clear()
    line = prepare(cfg, uri, 32, 90, 1, 0)
    assert f"{staging_dir(uri)}: already prepared there; uploading it" in said.messages and line.startswith(
        f"prepared {uri}"
    )
    assert shards.s3_manifest(uri, "")["counts"] == {"train": 36, "val": 9}


def test_a_second_prepare_to_the_same_prefix_on_this_machine_is_refused_while_the_first_runs(
    s3: dict[str, str], prepared: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    from fwk.data.publish import staging_dir

    use_s3(s3, monkeypatch, tmp_path)
    uri = "s3://data/sets/busy"
    staging_dir(uri).parent.mkdir(parents=True, exist_ok=True)
    with open(staging_dir(uri).with_suffix(".lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as the first prepare holds it
        with pytest.raises(UserError, match=f"^--out {uri}: another fwk data prepare is writing it on this machine"):
            prepare(ImageFolderConfig(root=str(prepared[0])), uri, 32, 90, 1, 0)
