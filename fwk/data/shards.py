"""Prepared shards (``fwk data prepare``, ``data=streaming``): where they are and their manifest.

A prepared set is a folder or an object-storage prefix holding litdata's shards of the
training and validation images (``train/``, ``val/``: an ``index.json`` and chunk files
each) and ``fwk-manifest.json``, written last: a set without a manifest is not finished.
The manifest holds the source's fingerprint, the prepare settings, the counts, the class
names, the mean/std the images are normalized with, and the format version.

Torch-free (the launcher reads the manifest before any run dir is made): S3 goes through
boto3, with the endpoint from ``data.endpoint_url`` (else ``AWS_ENDPOINT_URL``) and the
credentials and region from the usual AWS environment variables and files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fwk.errors import UserError

MANIFEST = "fwk-manifest.json"
FORMAT = 1  # of the prepared layout: a set of another format is refused


def is_remote(uri: str) -> bool:
    return urlparse(uri).scheme in ("s3",)


def storage_options(endpoint_url: str) -> dict[str, Any]:
    """boto3 client options for litdata and for the manifest: the endpoint, if one is set."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL", "")
    return {"endpoint_url": endpoint} if endpoint else {}


def _s3_manifest(uri: str, endpoint_url: str) -> dict[str, Any]:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

    parsed = urlparse(uri)
    bucket, key = parsed.netloc, f"{parsed.path.strip('/')}/{MANIFEST}".lstrip("/")
    options = storage_options(endpoint_url)
    where = f"{uri} (endpoint {options.get('endpoint_url', 'AWS default')})"
    config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2})  # a pre-flight check: brief
    try:
        body = boto3.client("s3", config=config, **options).get_object(Bucket=bucket, Key=key)["Body"].read()
    except NoCredentialsError:
        raise UserError(
            f"data.uri={uri}: no S3 credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
        ) from None
    except EndpointConnectionError:
        raise UserError(f"data.uri={uri}: cannot reach {where}; check data.endpoint_url or AWS_ENDPOINT_URL") from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            raise UserError(f"data.uri={uri}: bucket '{bucket}' does not exist at {where}") from None
        if code in ("NoSuchKey", "404"):
            raise UserError(
                f"data.uri={uri} holds no prepared set ({MANIFEST} is missing): run fwk data prepare, then copy "
                "its output there"
            ) from None
        raise UserError(f"data.uri={uri}: S3 refused to read {key} ({code or exc})") from None
    except BotoCoreError as exc:
        raise UserError(f"data.uri={uri}: cannot read {where} ({exc})") from None
    return json.loads(body)


def read_manifest(uri: str, endpoint_url: str = "") -> dict[str, Any]:
    """The manifest of the prepared set at ``uri``; one line when it cannot be used."""
    if not uri:
        raise UserError("data.uri is not set: the folder or s3://bucket/prefix that fwk data prepare wrote")
    if is_remote(uri):
        manifest = _s3_manifest(uri, endpoint_url)
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
    return manifest


def describe(manifest: dict[str, Any]) -> str:
    counts, settings = manifest["counts"], manifest["settings"]
    return (
        f"{counts['train']:,} train / {counts['val']:,} val images, shorter side <= {settings['max_side']} px, "
        f"JPEG quality {settings['quality']}, from {manifest['source']['what']}"
    )
