"""A real S3-compatible server on loopback (moto's ``moto_server``), for the streaming tests
and the decode benchmark: started, waited for, stopped; a folder uploaded with boto3."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def server_path() -> Path:
    return Path(sys.executable).with_name("moto_server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def loopback_s3() -> Iterator[str]:
    """The endpoint URL of a fresh server, up until the block ends (RuntimeError if it does not start)."""
    port = _free_port()
    proc = subprocess.Popen([str(server_path()), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def upload(endpoint: str, folder: Path, bucket: str, prefix: str) -> str:
    """Every file under ``folder`` to s3://bucket/prefix/ with the normal S3 client; returns that URI."""
    import boto3

    keys = {k.lower(): v for k, v in CREDENTIALS.items() if "KEY" in k}
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **keys)
    client.create_bucket(Bucket=bucket)
    for f in folder.rglob("*"):
        if f.is_file():
            client.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(folder).as_posix()}")
    return f"s3://{bucket}/{prefix}"
