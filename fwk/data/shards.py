"""Prepared shards (``fwk data prepare``, ``data=streaming``): where they are, and their manifest.

A prepared set is a folder or an object-storage prefix holding litdata's shards of the
training and validation images, and ``fwk-manifest.json``. ``train/`` and ``val/`` each hold
an ``index.json`` and chunk files. The manifest is written last, so a set without a manifest
is not finished. The manifest holds the source's fingerprint, the prepare settings, the
counts, the class names, the mean/std the images are normalized with, and the format version.

This module is torch-free, since the launcher reads the manifest before any run dir is made.
S3 goes through boto3, with the endpoint from ``data.endpoint_url``, else
``AWS_ENDPOINT_URL``. The credentials and region come from the usual AWS environment
variables and files.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fwk.errors import UserError

MANIFEST = "fwk-manifest.json"
MARKER = ".fwk-preparing"  # written first by a prepare, removed once its manifest is written
# The version of the prepared layout: a set of another format is refused. 2: the training items are
# written in a shuffled order (format 1's were sorted by class, which litdata's chunk-local
# shuffle cannot mix: whole epochs' halves of a few classes each)
FORMAT = 2
# The serializers of the fields fwk data prepare writes (fwk/data/prepare.py: the image's bytes, its
# label and its index): a set that declares any other is refused before anything reads it
SERIALIZERS = ("bytes", "int")


def is_remote(uri: str) -> bool:
    return urlparse(uri).scheme in ("s3",)


def storage_options(endpoint_url: str) -> dict[str, Any]:
    """Return the boto3 client options for litdata and for the manifest: the endpoint, if one is set."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL", "")
    return {"endpoint_url": endpoint} if endpoint else {}


def s3_client(uri: str, endpoint_url: str) -> tuple[Any, str, str, str]:
    """Return an s3:// URI's boto3 S3 client, bucket and key prefix, and "uri (endpoint ...)" for messages."""
    import boto3
    from botocore.config import Config

    parsed = urlparse(uri)
    if not parsed.netloc:
        raise UserError(f"{uri}: no bucket in it; expected s3://bucket/prefix")
    options = storage_options(endpoint_url)
    where = f"{uri} (endpoint {options.get('endpoint_url', 'AWS default')})"
    config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2})  # fail in seconds, not minutes
    return boto3.client("s3", config=config, **options), parsed.netloc, parsed.path.strip("/"), where


@contextlib.contextmanager
def s3_errors(label: str, uri: str, bucket: str, where: str) -> Iterator[None]:
    """Turn S3 failures inside the context into one line each: ``{label}={uri}: ...``.

    ``label`` is data.uri or --out."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

    setting = "--endpoint-url" if label == "--out" else "data.endpoint_url"
    try:
        yield
    except S3UploadFailedError as exc:  # upload_file wraps the ClientError it got (AccessDenied, ...)
        raise UserError(f"{label}={uri}: S3 refused an upload ({' '.join(str(exc).split())[:200]})") from None
    except NoCredentialsError:
        raise UserError(
            f"{label}={uri}: no S3 credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
        ) from None
    except EndpointConnectionError:
        raise UserError(f"{label}={uri}: cannot reach {where}; check {setting} or AWS_ENDPOINT_URL") from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            raise UserError(f"{label}={uri}: bucket '{bucket}' does not exist at {where}") from None
        raise UserError(f"{label}={uri}: S3 refused the request ({code or exc})") from None
    except BotoCoreError as exc:
        raise UserError(f"{label}={uri}: cannot reach {where} ({exc})") from None


def s3_manifest(uri: str, endpoint_url: str, label: str = "data.uri") -> dict[str, Any] | None:
    """Return the manifest under an s3:// prefix, or None when there is none.

    Other failures are one line."""
    from botocore.exceptions import ClientError

    client, bucket, prefix, where = s3_client(uri, endpoint_url)
    with s3_errors(label, uri, bucket, where):
        try:
            body = client.get_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST}".lstrip("/"))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") in ("NoSuchKey", "404"):
                return None
            raise
    return json.loads(body)


def read_manifest(uri: str, endpoint_url: str = "") -> dict[str, Any]:
    """Return the manifest of the prepared set at ``uri``, or say in one line why it cannot be used."""
    if not uri:
        raise UserError("data.uri is not set: the folder or s3://bucket/prefix that fwk data prepare wrote")
    if is_remote(uri):
        manifest = s3_manifest(uri, endpoint_url)
        if manifest is None:
            raise UserError(
                f"data.uri={uri} holds no prepared set ({MANIFEST} is missing): run fwk data prepare --out {uri}"
            )
    else:
        path = Path(os.path.expanduser(uri)) / MANIFEST
        if not path.is_file():
            hint = "an unfinished prepare (run it again)" if path.parent.is_dir() else "no such folder"
            raise UserError(f"data.uri={uri} holds no prepared set ({MANIFEST} is missing: {hint})")
        manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise UserError(
            f"data.uri={uri} was prepared by fwk {manifest.get('fwk', '?')} in format {manifest.get('format')}, "
            f"this fwk reads format {FORMAT}; prepare it again with this fwk (fwk data prepare)"
        )
    for split in ("train", "val"):
        check_fields(uri, split, _index(uri, endpoint_url, split))
    return manifest


def _index(uri: str, endpoint_url: str, split: str) -> dict[str, Any]:
    """Return the litdata ``index.json`` of one split of the set at ``uri``."""
    where = f"data.uri={uri}: {split}/index.json"
    if is_remote(uri):
        from botocore.exceptions import ClientError

        client, bucket, prefix, endpoint = s3_client(uri, endpoint_url)
        with s3_errors("data.uri", uri, bucket, endpoint):
            try:
                body = client.get_object(Bucket=bucket, Key=f"{prefix}/{split}/index.json".lstrip("/"))["Body"].read()
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code", "") not in ("NoSuchKey", "404"):
                    raise
                body = None
    else:
        path = Path(os.path.expanduser(uri)) / split / "index.json"
        body = path.read_bytes() if path.is_file() else None
    if body is None:
        raise UserError(f"{where} is missing: prepare the set again (fwk data prepare)")
    try:
        index = json.loads(body)
        index["config"]["data_format"]  # noqa: B018  (a KeyError or TypeError: not litdata's index)
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{where} is not a litdata index: prepare the set again (fwk data prepare)") from None
    return index


def check_fields(
    uri: str, split: str, index: dict[str, Any], fix: str = "prepare the set again with fwk data prepare"
) -> None:
    """Refuse a split whose items are read with any serializer that fwk data prepare does not write.

    litdata picks the serializer a field names in index.json. "pickle", also inside another's
    name as in "graph:pickle", would run in every loader worker whatever code was put there by
    whoever can write the set's folder or bucket."""
    config = index["config"]
    types = config.get("types") if isinstance(config.get("types"), dict) else {}  # field name -> serializer
    for k, fmt in enumerate(config["data_format"]):
        if fmt not in SERIALIZERS:
            name = next((n for n, f in types.items() if f == fmt), f"#{k}")
            raise UserError(
                f"data.uri={uri}: {split}/index.json reads field {name!r} with litdata's {fmt!r} serializer, which "
                f"fwk does not read (it could run code: only {', '.join(SERIALIZERS)}, as fwk data prepare writes); "
                f"{fix}"
            )


def describe(manifest: dict[str, Any]) -> str:
    counts, settings = manifest["counts"], manifest["settings"]
    return (
        f"{counts['train']:,} train / {counts['val']:,} val images, shorter side <= {settings['max_side']} px, "
        f"JPEG quality {settings['quality']}{_raw(settings)}, from {manifest['source']['what']}"
    )


def _raw(settings: dict[str, Any]) -> str:
    side = settings.get("raw_max_side", 0)  # sets written before it was a setting hold JPEGs only
    return f" (uncompressed up to {side} px)" if side else ""


def same_set(found: dict[str, Any], wanted: dict[str, Any], where: str) -> bool:
    """Return True when the manifest ``found`` at ``where``, an --out, is the set ``wanted``.

    A set of another format or source or settings is refused in one line."""
    if found.get("format") != wanted["format"]:
        raise UserError(
            f"--out {where} holds a set prepared by fwk {found.get('fwk', '?')} in format {found.get('format')}, "
            f"this fwk writes format {wanted['format']}; delete it to prepare it again there, or choose another --out"
        )
    if {k: found.get(k) for k in wanted} == wanted:
        return True
    raise UserError(
        f"--out {where} holds another prepared set ({describe(found)}); choose another --out, or delete it to "
        "prepare this one there"
    )
