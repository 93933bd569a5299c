"""The ASGI layer uvicorn calls first: health checks, refusals of requests for a Host not in
``serve.allowed_hosts``, and refusals of inference requests over ``serve.max_inflight``,
answered here (the health checks and the refusals past max_inflight from prepared bytes),
before any routing.

Under a flood the event loop's turn is as long as the ready connections times what each one
costs, and a health check waits one turn. A refusal through the routed app (routing, a
request object, a JSON response) costs about 250 µs of CPU; here it is the read of its body
and two ASGI messages. Everything else goes through to the app, which counts toward
``max_inflight`` every inference request that got past this layer, until it is answered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fwk.serve.metrics import Metrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_AFTER_S = 1
HEALTH = ("/v2/health/live", "/v2/health/ready")


def _reply(body: dict[str, Any], status: int, *extra: tuple[bytes, bytes]) -> tuple[Message, Message]:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]
    return {"type": "http.response.start", "status": status, "headers": headers}, {
        "type": "http.response.body",
        "body": data,
    }


def host_name(value: str) -> str:
    """The name in a Host header, lower case, without its port or brackets or final dot."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8000
        value = value[1 : value.find("]")] if "]" in value else value
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


class Front:
    """``app`` behind the two cheap answers. ``ready()`` tells whether the models are warm."""

    def __init__(
        self,
        app: App,
        ready: Callable[[], bool],
        metrics: Metrics,
        max_inflight: int,
        body_timeout_s: float,
        hosts: frozenset[str] | None = None,
    ) -> None:
        self.app, self.ready, self.metrics = app, ready, metrics
        self.most, self.body_timeout_s = max_inflight, body_timeout_s
        self.hosts = hosts  # the Host names answered (serve.allowed_hosts); None: any
        self.inflight = 0  # inference requests past this layer and not yet answered
        self.live = _reply({"live": True}, 200)
        self.warm = {True: _reply({"ready": True}, 200), False: _reply({"ready": False}, 503)}
        why = f"{max_inflight} requests in flight (serve.max_inflight={max_inflight}); retry shortly"
        self.busy = _reply({"error": why}, 503, (b"retry-after", str(RETRY_AFTER_S).encode()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        # Health checks are answered whatever their Host: they tell only whether the server is
        # up, and probes name the server by its IP address (kubelet sends Host: POD_IP:PORT),
        # which a list of the server's public names would otherwise refuse, restarting it
        if path in HEALTH and method in ("GET", "HEAD"):
            return await self._send(send, self.live if path == HEALTH[0] else self.warm[self.ready()])
        if self.hosts is not None and (refusal := self._foreign(scope)) is not None:
            await self._drain(receive)
            self.metrics.refused.labels("host").inc()
            return await self._send(send, refusal)
        if method != "POST" or not path.endswith("/infer"):
            return await self.app(scope, receive, send)
        if self.inflight >= self.most:
            # the body read and dropped first: a connection closed on unread data resets, and its
            # client may lose this very answer
            await self._drain(receive)
            self.metrics.refused.labels("inflight").inc()
            return await self._send(send, self.busy)
        self.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1

    def _foreign(self, scope: Scope) -> tuple[Message, Message] | None:
        """The 421 for a request whose Host is not answered here, else None."""
        value = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"), "")
        name = host_name(value)
        assert self.hosts is not None
        if name in self.hosts or any(h.startswith(".") and ("." + name).endswith(h) for h in self.hosts):
            return None
        known = sorted(self.hosts)
        why = (
            f"Host '{value}' is not one this server answers to ({', '.join(known)}); add '{name or 'NAME'}' to "
            f"serve.allowed_hosts, e.g. serve.allowed_hosts=[{','.join([*known, name or 'NAME'])}] ([*]: any)"
        )
        return _reply({"error": why}, 421)

    async def _drain(self, receive: Receive) -> None:
        """Read the body to its end, keeping none of it, for up to serve.body_timeout_s."""
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        return
        except TimeoutError:
            return

    @staticmethod
    async def _send(send: Send, reply: tuple[Message, Message]) -> None:
        start, body = reply
        await send(start)
        await send(body)
