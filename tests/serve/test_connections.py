"""The sockets a real `fwk serve` holds against slow clients: headers not complete within
serve.header_timeout_s get 408 and the socket closed, a byte at a time included; past
serve.max_connections a request gets uvicorn's 503 but a health check is answered; past the
cap of open sockets the connection waiting longest for its headers is closed for the new
one. One server for the module, with a 1 s header deadline and 4 connections."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fwk.errors import UserError
from fwk.serve.connections import RESERVED_FILES, check_open_files, headroom, protocol
from tests.serve.conftest import Exports, Server, free_port, get, start_server, stop

HEADER_TIMEOUT_S, MAX_CONNECTIONS = 1.0, 4
SETTINGS = [f"serve.header_timeout_s={HEADER_TIMEOUT_S}", f"serve.max_connections={MAX_CONNECTIONS}"]
SETTINGS += ["serve.max_inflight=2", "serve.warmup=0"]


@pytest.fixture(scope="module")
def server(exports: Exports, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log: Path = tmp_path_factory.mktemp("connections") / "serve.log"
    s = start_server(exports, exports.fp32, *SETTINGS, log=log)
    yield s
    stop(s)


def _connect(server: Server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _ask(server: Server, path: str, s: socket.socket | None = None) -> tuple[int, bytes]:
    """GET ``path`` on ``s`` (or a new connection); the status and the whole reply."""
    own = s is None
    s = s or _connect(server)
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < _length(reply):
            chunk = s.recv(65536)
            assert chunk, reply
            reply += chunk
        return int(reply.split()[1]), reply
    finally:
        if own:
            s.close()


def _length(reply: bytes) -> int:
    head = reply.partition(b"\r\n\r\n")[0].lower()
    line = next((x for x in head.split(b"\r\n") if x.startswith(b"content-length:")), b"content-length: 0")
    return int(line.split(b":")[1])


def _slow(server: Server, n: int, start: bytes = b"") -> list[socket.socket]:
    """``n`` connections that send ``start`` of a request's headers and then nothing."""
    socks = [_connect(server) for _ in range(n)]
    for s in socks:
        if start:
            s.sendall(start)
    time.sleep(0.2)  # accepted and read by the server
    return socks


def _closed_after(s: socket.socket, t0: float) -> tuple[bytes, float]:
    """What the server sent before closing ``s``, and when it closed, in seconds after ``t0``."""
    s.settimeout(5)
    reply = b""
    while chunk := s.recv(65536):
        reply += chunk
    return reply, time.perf_counter() - t0


def _refused(server: Server, reason: str) -> float:
    line = f'fwk_serve_refused_total{{reason="{reason}"}} '
    found = [x for x in get(server, "/metrics")[1].decode().splitlines() if x.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def _open(s: socket.socket) -> bool:
    """Whether the server has neither replied on ``s`` nor closed it (peeked: the reply stays)."""
    s.setblocking(False)
    try:
        s.recv(1, socket.MSG_PEEK)
        return False
    except BlockingIOError:
        return True
    finally:
        s.setblocking(True)


def test_slow_clients_at_max_connections_get_408_after_the_header_timeout_and_health_answers(server: Server) -> None:
    head = f"GET /v2/models/digits_cnn HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n".encode()  # no blank line
    before = _refused(server, "header_timeout")
    t0 = time.perf_counter()
    slow = _slow(server, MAX_CONNECTIONS, head)
    try:
        asked = time.perf_counter()
        assert _ask(server, "/v2/health/ready")[0] == 200 and time.perf_counter() - asked < 1  # not held up
        status, reply = _ask(server, "/v2/models/digits_cnn")  # a request past serve.max_connections
        assert status == 503 and reply.endswith(b"Service Unavailable"), reply
        closed = [_closed_after(s, t0) for s in slow]
    finally:
        for s in slow:
            s.close()
    for reply, seconds in closed:
        assert reply.startswith(b"HTTP/1.1 408 "), reply
        assert b"request headers not complete within serve.header_timeout_s=1 s; send them whole" in reply
        assert HEADER_TIMEOUT_S - 0.1 < seconds < HEADER_TIMEOUT_S + 1.5, seconds
    assert _ask(server, "/v2/models/digits_cnn")[0] == 200  # their sockets are free again
    assert _refused(server, "header_timeout") == before + MAX_CONNECTIONS


def test_a_byte_at_a_time_after_a_reply_does_not_hold_the_connection(server: Server) -> None:
    with _connect(server) as s:
        assert _ask(server, "/v2/health/live", s)[0] == 200  # a kept-alive connection
        t0 = time.perf_counter()
        sent = 0
        for byte in b"GET /v2/models/digits_cnn HTTP/1.1\r\nHost: x\r\n":
            if not _open(s):  # looked at before sending: a byte sent after the close would reset it
                break
            s.sendall(bytes([byte]))  # each one cancels uvicorn's keep-alive timer
            sent += 1
            time.sleep(0.1)
        reply, seconds = _closed_after(s, t0)
    assert reply.startswith(b"HTTP/1.1 408 ") and HEADER_TIMEOUT_S - 0.1 < seconds < HEADER_TIMEOUT_S + 1, (
        reply,
        seconds,
    )
    assert sent < 20, sent  # cut off while it was still sending, not after


def test_past_the_socket_cap_a_new_connection_closes_the_one_waiting_longest(server: Server) -> None:
    cap = MAX_CONNECTIONS + headroom(MAX_CONNECTIONS)
    before = _refused(server, "connections")
    slow = _slow(server, cap)  # connected, nothing sent
    try:
        t0 = time.perf_counter()
        assert _ask(server, "/v2/health/live")[0] == 200 and time.perf_counter() - t0 < 1
        reply, seconds = _closed_after(slow[0], t0)  # the oldest made room
        assert reply.startswith(b"HTTP/1.1 503 ") and seconds < 0.5, (reply, seconds)
        assert f"{cap} connections open (serve.max_connections={MAX_CONNECTIONS}".encode() in reply
        assert all(_open(s) for s in slow[1:]), "only the oldest is closed"
    finally:
        for s in slow:
            s.close()
    time.sleep(0.2)  # closed on the server's side too: /metrics is not past serve.max_connections
    assert _refused(server, "connections") == before + 1


@pytest.mark.parametrize("impl", ["h11_impl:H11Protocol", "httptools_impl:HttpToolsProtocol"])
def test_either_uvicorn_protocol_keeps_the_deadline_and_the_health_exemption(impl: str) -> None:
    """uvicorn picks httptools when it is installed, else h11: the same guard on both, in process."""
    import asyncio
    import importlib
    import threading

    import uvicorn

    module, name = impl.split(":")
    base = getattr(importlib.import_module(f"uvicorn.protocols.http.{module}"), name)

    async def app(scope, receive, send) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    config = uvicorn.Config(
        app, port=port, lifespan="off", log_level="warning", limit_concurrency=2, http=protocol(0.5, 2, base)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    fake = Server(None, port, Path("/dev/null"))  # type: ignore[arg-type]
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        t0 = time.perf_counter()
        slow = _slow(fake, 2, b"GET / HTTP/1.1\r\n")
        assert _ask(fake, "/v2/health/live")[0] == 200
        assert _ask(fake, "/")[0] == 503
        for s in slow:
            reply, seconds = _closed_after(s, t0)
            assert reply.startswith(b"HTTP/1.1 408 ") and 0.4 < seconds < 2, (reply, seconds)
            s.close()
        assert _ask(fake, "/")[0] == 200
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_open_files_limit_is_raised_to_hold_the_cap_or_the_setting_is_refused(monkeypatch) -> None:
    import resource

    limits = [(1024, 4096)]
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits[-1])
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: limits.append(value))
    check_open_files(1024)  # 1024 sockets, 128 more past the limit, the server's own files
    assert limits[-1] == (1024 + 128 + RESERVED_FILES, 4096)
    limits.append((1024, 1024))
    with pytest.raises(UserError) as refused:
        check_open_files(1024)
    assert str(refused.value) == (
        "serve.max_connections=1024 needs 1408 open files, but this process may open 1024 (ulimit -Hn): lower it, "
        "e.g. serve.max_connections=683, or raise the limit"
    )
    assert 683 + headroom(683) + RESERVED_FILES <= 1024 < 684 + headroom(684) + RESERVED_FILES
