"""A real S3-compatible server on loopback (moto's ``moto_server``), for the streaming tests
and the decode benchmark: started, waited for, stopped; a folder uploaded with boto3; and
a proxy in front of it that never answers for chosen objects (a server that stalls)."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


@contextmanager
def stalling(endpoint: str, stalls: Callable[[str], bool], refuse: bool = False) -> Iterator[str]:
    """The endpoint URL of a proxy to ``endpoint`` that forwards every request but those
    whose path ``stalls``: it holds those open, unanswered, until the block ends (a server
    that stalls), or with ``refuse`` answers them at once with S3's 403 AccessDenied."""
    upstream = endpoint.removeprefix("http://")
    released = threading.Event()

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect

        def _forward(self) -> None:
            if stalls(self.path) and refuse:
                denied = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
                self.send_response(403)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(denied)))
                self.end_headers()
                self.wfile.write(denied)
                return
            if stalls(self.path):
                released.wait()
                self.close_connection = True
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            conn = http.client.HTTPConnection(upstream, timeout=30)
            conn.request(self.command, self.path, body, dict(self.headers))
            reply = conn.getresponse()
            data = reply.read()
            self.send_response(reply.status)
            for key, value in reply.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            self.send_header("Content-Length", reply.getheader("Content-Length") or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        released.set()
        server.shutdown()
        server.server_close()
