"""The sockets uvicorn holds: how long a connection may take to send its request's headers,
and how many may be open at once.

uvicorn times only the idle wait between two requests (``timeout_keep_alive``: armed after a
response, cancelled by any byte received), so a connection that never completes its headers,
or sends a byte every few seconds, is held forever, and each one holds a file descriptor.
Its ``limit_concurrency`` answers 503 once a request's headers are in while that many
connections are open, but it accepts every connection, the slow ones included.

``protocol()`` returns uvicorn's HTTP protocol class (httptools', else h11's, as uvicorn's
own choice) with three changes:

- a header deadline: a connection is closed, with a 408, unless its request's headers are
  complete within ``serve.header_timeout_s`` of it opening, or of the first byte it sends
  after its last response (the idle wait before that byte stays uvicorn's keep-alive);
- health checks exempt from ``limit_concurrency`` (``serve.max_connections``): they are
  answered from prepared bytes by the Front, so they cost what a 503 costs, and a probe that
  got 503 because slow clients hold the sockets would have the server restarted for nothing;
- a cap on open sockets, ``serve.max_connections`` plus ``headroom()``: a connection past it
  closes the one that has waited longest for its headers (a slow client's: a real client
  sends them in one packet), or itself when none waits. So slow clients can hold at most the
  cap's sockets and only until their deadline, and a health check gets in unless every one of
  those sockets carries a request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from fwk.serve.front import HEALTH


def headroom(max_connections: int) -> int:
    """Sockets open past serve.max_connections before a new one evicts a slow one: room for
    the health checks, which the limit lets through, and for the 503s uvicorn answers past it
    (an eighth, so that a burst of real clients gets 503s rather than closed sockets)."""
    return max(16, max_connections // 8)


def _closing(status: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body


class _Guard:
    """What ``protocol()`` adds to uvicorn's protocol class, which comes after it in the
    class's bases; the class attributes are set per server by ``protocol()``."""

    header_timeout_s: float
    most: int  # open sockets at most: serve.max_connections and its headroom
    waiting: dict[Any, None]  # the connections whose header deadline runs, oldest first
    late: bytes  # the 408 past the header deadline
    evicted: bytes  # the 503 of a connection closed for a new one past ``most``
    count: Callable[[str], None]

    _deadline: asyncio.TimerHandle | None = None
    _since: Any = None  # the request cycle that was the newest when the deadline was armed
    _limit: int | None = None

    @property  # read by uvicorn once a request's headers are in, against the open connections
    def limit_concurrency(self) -> int | None:
        scope = self.scope
        if scope is not None and scope.get("path") in HEALTH and scope.get("method") in ("GET", "HEAD"):
            return None
        return self._limit

    @limit_concurrency.setter
    def limit_concurrency(self, value: int | None) -> None:
        self._limit = value

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.most:
            self._evict()
        if not self.transport.is_closing():
            self._arm()

    def data_received(self, data: bytes) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        if self._deadline is None and idle and not self.transport.is_closing():
            self._arm()  # the first byte of the next request: its headers are due from now
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._disarm()  # until the next request's first byte; the idle wait is keep-alive's
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._since = self.cycle
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expire)
        self.waiting[self] = None

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.waiting.pop(self, None)

    def _awaits_headers(self) -> bool:
        # uvicorn makes a new cycle once a request's headers are in
        return self._deadline is not None and self.cycle is self._since and not self.transport.is_closing()

    def _expire(self) -> None:
        self._deadline = None
        self.waiting.pop(self, None)
        if self.cycle is self._since and not self.transport.is_closing():
            self._refuse(self.late)
            self.count("header_timeout")

    def _evict(self) -> None:
        while self.waiting:
            oldest = next(iter(self.waiting))
            if oldest._awaits_headers():
                oldest._refuse(self.evicted)
                return self.count("connections")
            del self.waiting[oldest]  # its headers came in: it is re-armed after its response
        self._refuse(self.evicted)
        self.count("connections")

    def _refuse(self, reply: bytes) -> None:
        self._disarm()
        self.transport.write(reply)
        self.transport.close()


def protocol(
    header_timeout_s: float,
    max_connections: int,
    base: type | None = None,
    count: Callable[[str], None] = lambda reason: None,
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (or ``base``) with the header deadline, the health
    checks' exemption from the connection limit and the cap on open sockets. ``count(reason)``
    is called for each connection closed: ``header_timeout``, or ``connections`` (evicted)."""
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base
    most = max_connections + headroom(max_connections)
    late = f"request headers not complete within serve.header_timeout_s={header_timeout_s:g} s; send them whole"
    evicted = (
        f"{most} connections open (serve.max_connections={max_connections} and {most - max_connections} more); "
        "this one waited longest for its request headers: retry shortly"
    )
    settings = {
        "header_timeout_s": header_timeout_s,
        "most": most,
        "waiting": {},
        "late": _closing("408 Request Timeout", late),
        "evicted": _closing("503 Service Unavailable", evicted),
        "count": staticmethod(count),
    }
    return type(f"Guarded{base.__name__}", (_Guard, base), settings)


RESERVED_FILES = 256  # the server's own: model files, onnxruntime's and the event loop's descriptors, logs


def check_open_files(max_connections: int) -> None:
    """Make room for the cap of sockets plus the server's own files in the limit on open files
    (raising the soft limit up to the hard one), or refuse in one line: an accept that fails
    for want of a descriptor stops the server accepting anything, health checks included."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return
    need = max_connections + headroom(max_connections) + RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        from fwk.errors import UserError

        fits = next((m for m in range(hard, 0, -1) if m + headroom(m) + RESERVED_FILES <= hard), 1)
        raise UserError(
            f"serve.max_connections={max_connections} needs {need} open files, but this process may open {hard} "
            f"(ulimit -Hn): lower it, e.g. serve.max_connections={fits}, or raise the limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
