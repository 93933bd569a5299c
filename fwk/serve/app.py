"""The HTTP routes: the Open Inference Protocol (KServe v2), Triton's repository index,
promote/rollback of a canary, per-version stats, and Prometheus ``/metrics``.

Every error is JSON, ``{"error": "..."}`` (the v2 protocol's form, which tritonclient
reads): 400 for a bad input (checked before it joins a batch; or one the model failed on
while the rest of its batch ran), 401/403 for promote and rollback without the admin token
or from another origin, 404 for an unknown model, version or path, 408 for a body that
does not arrive in time, 413 for an oversized body or request, 409 for a promote without a
canary, 503 with Retry-After while warming up or over a bound (requests in flight, a
version's queue), 504 past the request deadline, 500 if the model itself fails. Each bound
counts its refusals (``fwk_serve_refused_total``). No request can stop the server, and a
large body is parsed, and a large reply written, off the event loop: the health checks
keep answering.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fwk import __version__
from fwk.serve import protocol
from fwk.serve.batcher import InputFailed, Overloaded
from fwk.serve.front import RETRY_AFTER_S, Front
from fwk.serve.protocol import BadRequest
from fwk.serve.repository import Repository

logger = logging.getLogger(__name__)

OFF_LOOP_BYTES = 64 * 1024  # a body (or reply) larger than this is parsed (written) in a thread


def _error(message: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _off_loop(big: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` in a thread when ``big``, so that the event loop keeps answering
    meanwhile, and here otherwise."""
    return await asyncio.to_thread(fn, *args) if big else fn(*args)


class Refused(BadRequest):
    """A request turned away by a bound (503 + Retry-After, 504, 408), counted by reason."""

    def __init__(self, message: str, status: int, reason: str) -> None:
        super().__init__(message, status)
        self.reason = reason


class _Routes:
    """The routes, with the repository and the admin token that they read."""

    def __init__(self, repo: Repository, admin_token: str) -> None:
        self.repo = repo
        self.admin_token = admin_token
        self.limit = int(repo.cfg.max_body_mb * 1024 * 1024)

    def model_of(self, request: Request) -> str:
        name = request.path_params["name"]
        if name not in self.repo.routers:
            raise BadRequest(f"unknown model '{name}'; this server has: {', '.join(sorted(self.repo.routers))}", 404)
        return name

    def version_of(self, model: str, request: Request) -> str | None:
        v = request.path_params.get("version")
        if v is not None and v not in self.repo.versions[model]:
            have = ", ".join(self.repo.versions[model])
            raise BadRequest(f"model {model} has no version '{v}'; its versions: {have}", 404)
        return v

    async def body_of(self, request: Request) -> bytes:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.limit:
            over = f"request body of {int(size)} bytes is over serve.max_body_mb={self.repo.cfg.max_body_mb:g}"
            raise BadRequest(over, 413)
        chunks, n = [], 0

        async def read() -> None:
            nonlocal n
            async for chunk in request.stream():
                n += len(chunk)
                if n > self.limit:
                    raise BadRequest(f"request body is over serve.max_body_mb={self.repo.cfg.max_body_mb:g}", 413)
                chunks.append(chunk)

        try:
            await asyncio.wait_for(read(), self.repo.cfg.body_timeout_s)
        except asyncio.TimeoutError:
            what = f"{n} bytes of the body arrived in serve.body_timeout_s={self.repo.cfg.body_timeout_s:g} s"
            raise Refused(f"{what}; send it whole", 408, "body_timeout") from None
        return b"".join(chunks)

    def check_admin(self, request: Request) -> None:
        """Allow promote and rollback only with the token, and never from a web page of another
        origin."""
        if not self.admin_token:
            off = "promote and rollback are off (serve.admin_token is empty); start with serve.admin_token=auto"
            raise BadRequest(off, 403)
        origin = request.headers.get("origin")
        fetched = request.headers.get("sec-fetch-site", "")
        if (origin is not None and origin.split("://")[-1] != request.headers.get("host")) or fetched == "cross-site":
            raise BadRequest(
                f"cross-origin request ({origin or fetched}) refused: promote and rollback are same-origin", 403
            )
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.admin_token}".encode()):
            raise BadRequest(
                f"{request.url.path} needs the admin token (Authorization: Bearer TOKEN), printed when fwk serve "
                "started or set by serve.admin_token",
                401,
            )

    async def server_metadata(self, request: Request) -> JSONResponse:
        extensions = ["binary_tensor_data", "model_repository"]
        return JSONResponse({"name": "fwk", "version": __version__, "extensions": extensions})

    async def model_ready(self, request: Request) -> Response:
        model = self.model_of(request)
        v = self.version_of(model, request) or self.repo.routers[model].stable
        ok = self.repo.ready and self.repo.versions[model][v].batcher is not None
        return JSONResponse({"name": model, "version": v, "ready": ok}, status_code=200 if ok else 503)

    async def model_metadata(self, request: Request) -> Response:
        model = self.model_of(request)
        v = self.version_of(model, request)
        entry = await self.repo.get(model, v or self.repo.routers[model].stable)
        assert entry.loaded is not None
        return JSONResponse(
            {
                "name": model,
                "versions": [v] if v else list(self.repo.versions[model]),
                "platform": "onnxruntime_onnx",
                "inputs": [entry.loaded.input.describe()],
                "outputs": [t.describe() for t in entry.loaded.outputs],
            }
        )

    async def infer(self, request: Request) -> Response:  # past serve.max_inflight: refused by the Front
        try:
            return await asyncio.wait_for(self.answer(request), self.repo.cfg.request_timeout_s)
        except asyncio.TimeoutError:  # its batch, if queued, is dropped: nobody waits for it
            raise Refused(
                f"no answer within serve.request_timeout_s={self.repo.cfg.request_timeout_s:g} s", 504, "deadline"
            ) from None

    async def answer(self, request: Request) -> Response:
        t0 = time.perf_counter()
        model = self.model_of(request)
        asked = self.version_of(model, request)
        if not self.repo.ready:
            raise Refused("the server is warming up; wait for GET /v2/health/ready", 503, "warming")
        body = await self.body_of(request)
        router = self.repo.routers[model]
        big = len(body) > OFF_LOOP_BYTES
        head, rest = await _off_loop(big, protocol.split, body, request.headers.get(protocol.HEADER_LENGTH))
        client = request.headers.get("x-client-id") or protocol.client_id(head)
        version = asked or router.pick(client)
        entry = await self.repo.get(model, version)
        assert entry.loaded is not None and entry.batcher is not None
        want, outputs = entry.loaded.input, entry.loaded.outputs
        parsed = await _off_loop(big, protocol.parse, head, rest, model, want, outputs, self.repo.cfg.max_request_rows)
        labels = self.repo.metrics.latency.labels(model, version)
        try:
            result = await entry.batcher.submit(parsed.x, parsed.high)
        except Overloaded as exc:
            raise Refused(f"model {model} version {version} is busy: {exc}; retry shortly", 503, "queue") from None
        except InputFailed as exc:  # its own input: the caller's error, not charged to the version
            self.repo.metrics.requests.labels(model, version, "400").inc()
            return _error(f"model {model} version {version} cannot run this input: {exc}", 400)
        except Exception as exc:  # the model failed: this version's error, not the caller's
            router.record(version, time.perf_counter() - t0, ok=False, routed=asked is None)
            self.repo.metrics.requests.labels(model, version, "500").inc()
            return _error(f"model {model} version {version} failed: {type(exc).__name__}: {exc}", 500)
        large = sum(o.nbytes for o in result.outputs) > OFF_LOOP_BYTES
        body, headers = await _off_loop(large, protocol.reply, model, version, parsed, outputs, result.outputs)
        seconds = time.perf_counter() - t0
        decision = router.record(version, seconds, ok=True, routed=asked is None)
        if decision is not None:
            logger.info(
                f"auto-{decision['action']} of {model}: {decision['from']} -> {decision['to']}; {decision['why']}"
            )
        labels.observe(seconds)
        self.repo.metrics.queue_delay.labels(model, version).observe(result.queue_s)
        self.repo.metrics.requests.labels(model, version, "200").inc()
        return Response(body, headers=headers)

    async def switch(self, request: Request) -> Response:
        model = self.model_of(request)
        self.check_admin(request)
        router = self.repo.routers[model]
        action = request.url.path.rsplit("/", 1)[1]
        if router.canary is None:
            raise BadRequest(f"model {model} has no canary to {action}; start with --canary EXPORT_ID", 409)
        await self.repo.get(model, router.canary)
        decision = router.promote() if action == "promote" else router.rollback()
        logger.info(f"{action} of {model}: {decision['from']} -> {decision['to']}")
        return JSONResponse(decision | {"stable": router.stable})

    async def stats(self, request: Request) -> Response:
        model = self.model_of(request)
        batches = {
            v: {str(r): round(s * 1000, 4) for r, s in sorted(e.batcher.seconds.items())}
            for v, e in self.repo.versions[model].items()
            if e.batcher is not None
        }
        return JSONResponse({"name": model, **self.repo.routers[model].state(), "batch_ms": batches})

    async def repository_index(self, request: Request) -> Response:
        rows: list[dict[str, Any]] = []
        for model, versions in self.repo.versions.items():
            for v, e in versions.items():
                state = "READY" if e.batcher is not None else "UNAVAILABLE"
                reason = "" if e.batcher is not None else "loads on its first request"
                rows.append({"name": model, "version": v, "state": state, "reason": reason})
        return JSONResponse(rows)

    async def metrics(self, request: Request) -> Response:
        return Response(self.repo.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def bad_request(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BadRequest)
        if isinstance(exc, Refused):
            self.repo.metrics.refused.labels(exc.reason).inc()
            if exc.status == 503:
                return _error(str(exc), 503, {"Retry-After": str(RETRY_AFTER_S)})
        return _error(str(exc), exc.status)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return _error(f"no route {request.method} {request.url.path}; see the v2 protocol's /v2/... paths", 404)
        return _error(str(exc.detail), exc.status_code)

    async def crash(self, request: Request, exc: Exception) -> Response:
        # our bug: 500 and a log line, never a dead server
        logger.info(f"error on {request.method} {request.url.path}: {type(exc).__name__}: {exc}")
        return _error(f"internal error: {type(exc).__name__}: {exc}", 500)

    @asynccontextmanager
    async def lifespan(self, app: Starlette):
        import asyncio

        warm = asyncio.get_running_loop().create_task(self.repo.start())  # live now, ready after warm-up
        try:
            yield
        finally:
            if not warm.done():
                warm.cancel()
            await self.repo.stop()


def build(repo: Repository, admin_token: str = "", hosts: frozenset[str] | None = None) -> Front:
    """Build the routed app behind its Front, which answers health checks and refuses requests
    past serve.max_inflight, and those for a Host not in ``hosts`` (None: any).

    ``admin_token`` is what promote and rollback require. When it is empty, they are off."""
    r = _Routes(repo, admin_token)
    routes = [
        Route("/v2", r.server_metadata),
        Route("/v2/models/{name}", r.model_metadata),
        Route("/v2/models/{name}/versions/{version}", r.model_metadata),
        Route("/v2/models/{name}/ready", r.model_ready),
        Route("/v2/models/{name}/versions/{version}/ready", r.model_ready),
        Route("/v2/models/{name}/infer", r.infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", r.infer, methods=["POST"]),
        Route("/v2/models/{name}/promote", r.switch, methods=["POST"]),
        Route("/v2/models/{name}/rollback", r.switch, methods=["POST"]),
        Route("/v2/models/{name}/stats", r.stats),
        Route("/v2/repository/index", r.repository_index, methods=["POST"]),
        Route("/metrics", r.metrics),
    ]
    handlers = {BadRequest: r.bad_request, HTTPException: r.http_error, Exception: r.crash}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=r.lifespan)
    return Front(app, lambda: repo.ready, repo.metrics, repo.cfg.max_inflight, repo.cfg.body_timeout_s, hosts)
