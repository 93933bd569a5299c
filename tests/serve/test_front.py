"""The Front: health checks and refusals past serve.max_inflight are answered before the app
is called, with the body read to its end; everything else reaches the app, and inference
requests count as in flight until answered, failed or not."""

from __future__ import annotations

import asyncio
import json

import pytest

from fwk.serve.front import Front, host_name
from fwk.serve.metrics import Metrics


class App:
    """The routed app's stand-in: an inference request waits for ``go``; ``fail`` makes it raise."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.go = asyncio.Event()
        self.fail = False

    async def __call__(self, scope, receive, send) -> None:
        self.calls.append(scope["path"])
        if scope["path"].endswith("/infer"):
            await self.go.wait()
            if self.fail:
                raise RuntimeError("model failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"app"})


def body(*chunks: bytes, hang: bool = False):
    """An ASGI receive() giving ``chunks`` as the body; with ``hang``, the last never comes."""
    read: list[bytes] = []
    todo = list(chunks)

    async def receive():
        if hang and len(todo) == 1:
            await asyncio.sleep(3600)
        chunk = todo.pop(0)
        read.append(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(todo)}

    return receive, read


async def call(front: Front, path: str, method: str = "POST", receive=None) -> tuple[int, dict, bytes]:
    sent: list[dict] = []

    async def send(message) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "method": method}
    await front(scope, receive or body(b"{}")[0], send)
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def refused(metrics: Metrics) -> float:
    return metrics.refused.labels("inflight")._value.get()


def front(app: App, ready: list[bool], most: int = 2, body_timeout_s: float = 5.0) -> tuple[Front, Metrics]:
    metrics = Metrics()
    return Front(app, lambda: ready[0], metrics, most, body_timeout_s), metrics


def test_health_is_answered_without_the_app_and_follows_readiness() -> None:
    async def main() -> None:
        app, ready = App(), [False]
        f, _ = front(app, ready)
        status, headers, data = await call(f, "/v2/health/live", "GET")
        assert (status, json.loads(data)) == (200, {"live": True})
        assert headers["content-length"] == str(len(data)) and headers["content-type"] == "application/json"
        status, _, data = await call(f, "/v2/health/ready", "GET")
        assert (status, json.loads(data)) == (503, {"ready": False})
        ready[0] = True
        status, _, data = await call(f, "/v2/health/ready", "HEAD")
        assert (status, json.loads(data)) == (200, {"ready": True})
        assert app.calls == []

    asyncio.run(main())


def test_past_max_inflight_the_body_is_read_and_503_sent_without_the_app() -> None:
    async def main() -> None:
        app = App()
        f, metrics = front(app, [True], most=2)
        held = [asyncio.create_task(call(f, "/v2/models/m/infer")) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert f.inflight == 2 and len(app.calls) == 2
        receive, read = body(b'{"inputs"', b": []}")
        status, headers, data = await call(f, "/v2/models/m/versions/1/infer", receive=receive)
        assert status == 503 and headers["retry-after"] == "1"
        assert json.loads(data)["error"] == "2 requests in flight (serve.max_inflight=2); retry shortly"
        assert read == [b'{"inputs"', b": []}"]  # drained to its end: the connection stays usable
        assert len(app.calls) == 2 and refused(metrics) == 1
        app.go.set()
        assert [(await t)[0] for t in held] == [200, 200]
        assert f.inflight == 0
        assert (await call(f, "/v2/models/m/infer"))[0] == 200

    asyncio.run(main())


def test_a_failed_request_leaves_the_count_and_others_are_not_counted() -> None:
    async def main() -> None:
        app = App()
        app.go.set()
        app.fail = True
        f, _ = front(app, [True], most=1)
        with pytest.raises(RuntimeError, match="model failed"):
            await call(f, "/v2/models/m/infer")
        assert f.inflight == 0
        app.fail = False
        for path, method in (("/v2/models/m", "GET"), ("/metrics", "GET"), ("/v2/models/m/infer", "GET")):
            assert (await call(f, path, method))[2] == b"app"
        assert f.inflight == 0 and app.calls[-3:] == ["/v2/models/m", "/metrics", "/v2/models/m/infer"]

    asyncio.run(main())


def test_a_body_that_never_ends_is_refused_after_body_timeout() -> None:
    async def main() -> None:
        app = App()
        f, metrics = front(app, [True], most=1, body_timeout_s=0.05)
        held = asyncio.create_task(call(f, "/v2/models/m/infer"))
        await asyncio.sleep(0.01)
        receive, read = body(b"{", b"}", hang=True)
        status, _, _ = await asyncio.wait_for(call(f, "/v2/models/m/infer", receive=receive), 2)
        assert status == 503 and read == [b"{"] and refused(metrics) == 1
        app.go.set()
        await held

    asyncio.run(main())


def test_a_host_not_allowed_is_421_naming_the_setting_and_health_checks_are_answered_whatever_the_host() -> None:
    async def main() -> None:
        app = App()
        app.go.set()
        metrics = Metrics()
        f = Front(app, lambda: True, metrics, 2, 5.0, frozenset({"api.example", ".corp.example"}))

        async def ask(host: bytes | None, path: str = "/v2/models/m", method: str = "GET", receive=None):
            sent: list[dict] = []

            async def send(message) -> None:
                sent.append(message)

            headers = [(b"host", host)] if host is not None else []
            scope = {"type": "http", "path": path, "method": method, "headers": headers}
            await f(scope, receive or body(b"")[0], send)
            return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

        for host in (b"api.example:8000", b"API.example.", b"corp.example", b"a.b.corp.example:1"):
            assert await ask(host) == (200, b"app"), host
        receive, read = body(b'{"inputs"', b": []}")
        status, data = await ask(b"evil.example:8000", "/v2/models/m/infer", "POST", receive)
        assert status == 421 and read == [b'{"inputs"', b": []}"]  # drained: the connection stays usable
        assert json.loads(data)["error"] == (
            "Host 'evil.example:8000' is not one this server answers to (.corp.example, api.example); add "
            "'evil.example' to serve.allowed_hosts, e.g. serve.allowed_hosts=[.corp.example,api.example,evil.example] "
            "([*]: any)"
        )
        for host in (b"evilcorp.example", b"api.example.evil", b"[::1]:8000", None):
            assert (await ask(host))[0] == 421, host
        assert (await ask(b"evil.example", "/v2/health/ready"))[0] == 200  # a probe by IP or any name
        assert app.calls == ["/v2/models/m"] * 4
        assert metrics.refused.labels("host")._value.get() == 5

    asyncio.run(main())


@pytest.mark.parametrize(
    "value,name",
    [
        ("localhost:8000", "localhost"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("Api.Example.", "api.example"),
    ],
)
def test_host_name_drops_the_port_brackets_case_and_final_dot(value: str, name: str) -> None:
    assert host_name(value) == name
