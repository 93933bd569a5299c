"""The real `fwk serve` over HTTP: tritonclient, warm-up before ready, batching, priority, bad input, metrics.

One server for the module: the fp32 and int8 exports of one run (int8 addressed by
version), adaptive batching off and a 300 ms max delay, so that batching and priority
show in wall-clock times, and a small body limit."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import require
from tests.serve.conftest import Exports, Server, admin, get, start_server, stop

try:
    import tritonclient.http as triton
except ImportError:  # pragma: no cover - the test extra has it
    triton = None

DELAY_MS, MAX_BATCH = 300, 16
SETTINGS = [f"serve.max_delay_ms={DELAY_MS}", "serve.adaptive=false", f"serve.max_batch_size={MAX_BATCH}"]
SETTINGS += ["serve.max_body_mb=0.05", "serve.warmup=1", "serve.max_request_rows=32"]


@pytest.fixture(scope="module")
def server(exports: Exports, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("serve-app") / "serve.log"
    s = start_server(exports, exports.fp32, exports.int8, "--preload", *SETTINGS, log=log)
    yield s
    stop(s)


def _client(server: Server):
    require(triton is not None, "tritonclient[http] is not installed (pip install -e '.[test]')")
    return triton.InferenceServerClient(server.url, concurrency=8, network_timeout=30)


def _infer(client, x: np.ndarray, version: str = "", **kw) -> np.ndarray:
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer("digits_cnn", [inp], model_version=version, **kw).as_numpy("logits")


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 1, 8, 8)).astype(np.float32)


def _metric(server: Server, name: str, **labels: str) -> float:
    text = get(server, "/metrics")[1].decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_ready_only_after_every_version_is_warmed_up(server: Server, exports: Exports) -> None:
    log = server.output()
    assert log.index("ready: 2 version(s) warmed up") > log.index(f"loaded digits_cnn version {exports.int8}")
    for version in (exports.fp32, exports.int8):
        for size in range(1, MAX_BATCH + 1):  # one warm-up run (serve.warmup=1) at every batch size
            assert _metric(server, "fwk_serve_warmup_inferences_total", version=version, batch_size=str(size)) == 1
    status, body = get(server, "/v2/models/digits_cnn/stats")
    timed = json.loads(body)["batch_ms"][exports.fp32]
    assert sorted(map(int, timed)) == list(range(1, MAX_BATCH + 1)) and all(v > 0 for v in timed.values())


def test_tritonclient_matches_onnxruntime(server: Server, exports: Exports) -> None:
    client = _client(server)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("digits_cnn")
    meta = client.get_model_metadata("digits_cnn")
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert meta["versions"] == [exports.fp32, exports.int8]
    index = client.get_model_repository_index()
    assert {(m["name"], m["version"], m["state"]) for m in index} == {
        ("digits_cnn", exports.fp32, "READY"),
        ("digits_cnn", exports.int8, "READY"),
    }
    x = _images(5)
    for version in (exports.fp32, exports.int8):
        direct = ort.InferenceSession(str(exports.model(version)), providers=["CPUExecutionProvider"])
        want = direct.run(None, {"input": x})[0]
        got = _infer(client, x, version)
        # the same model and input in the same library; batch shape and threads may change the summation order
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the default version is the first listed, the fp32 export, which is also --output's model
    default = _infer(client, x)
    fp32 = ort.InferenceSession(str(exports.output), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(default, fp32, rtol=1e-5, atol=1e-5)
    # JSON tensors (no binary extension) give the same numbers
    req = {"inputs": [{"name": "input", "shape": [5, 1, 8, 8], "datatype": "FP32", "data": x.ravel().tolist()}]}
    status, body = get(server, "/v2/models/digits_cnn/infer", json.dumps(req).encode())
    assert status == 200
    out = json.loads(body)["outputs"][0]
    assert out["shape"] == [5, 10]
    np.testing.assert_allclose(np.array(out["data"]).reshape(5, 10), fp32, rtol=1e-5, atol=1e-5)


def test_concurrent_requests_are_batched_and_answered_to_their_callers(server: Server, exports: Exports) -> None:
    _client(server)  # skips (or fails in CI) without tritonclient
    before = _metric(server, "fwk_serve_batch_size_sum", version=exports.fp32)
    batches_before = _metric(server, "fwk_serve_batch_size_count", version=exports.fp32)
    xs = [_images(1 + i % 3, seed=i) for i in range(24)]  # each caller's own tag: its seed
    direct = ort.InferenceSession(str(exports.model(exports.fp32)), providers=["CPUExecutionProvider"])
    with ThreadPoolExecutor(24) as pool:
        t0 = time.perf_counter()
        got = list(pool.map(lambda x: _infer(triton.InferenceServerClient(server.url), x), xs))
        took = time.perf_counter() - t0
    for x, y in zip(xs, got, strict=True):
        np.testing.assert_allclose(y, direct.run(None, {"input": x})[0], rtol=1e-5, atol=1e-5)
    rows = _metric(server, "fwk_serve_batch_size_sum", version=exports.fp32) - before
    batches = _metric(server, "fwk_serve_batch_size_count", version=exports.fp32) - batches_before
    assert rows == sum(len(x) for x in xs)
    assert rows / batches > 1, (rows, batches)  # the mean batch size
    assert took < 10, took


def test_high_priority_is_not_held_back_by_max_delay(server: Server) -> None:
    client = _client(server)
    x = _images(1)
    t0 = time.perf_counter()
    _infer(client, x)
    normal = time.perf_counter() - t0
    t0 = time.perf_counter()
    _infer(client, x, parameters=None, priority=1)  # tritonclient's priority 1: Triton's highest
    high = time.perf_counter() - t0
    req = {"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": x.ravel().tolist()}]}
    req["parameters"] = {"priority": "high"}
    t0 = time.perf_counter()
    assert get(server, "/v2/models/digits_cnn/infer", json.dumps(req).encode())[0] == 200
    high_json = time.perf_counter() - t0
    assert normal >= DELAY_MS / 1000 * 0.9  # a lone normal request waits for company
    assert high < DELAY_MS / 1000 / 2 and high_json < DELAY_MS / 1000 / 2, (normal, high, high_json)


def _tensor(shape, datatype="FP32", name="input", n=None):
    count = int(np.prod(shape)) if n is None else n
    return {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": [0.0] * count}]}


def _params(shape, params):
    req = _tensor(shape)
    req["inputs"][0]["parameters"] = params
    return req


def _rows(shape, rows: int):
    req = _tensor(shape)
    req["inputs"][0]["data"] = [[0] * 64] * rows
    return req


def _nan(shape):
    req = _tensor(shape)
    req["inputs"][0]["data"][3] = float("nan")
    return req


BAD = [
    ("/v2/models/digits_cnn/infer", _tensor([2, 8, 8]), 400, "has shape [2, 8, 8]; expected [-1, 1, 8, 8]"),
    ("/v2/models/digits_cnn/infer", _tensor([1, 1, 8, 9]), 400, "expected [-1, 1, 8, 8]"),
    ("/v2/models/digits_cnn/infer", _tensor([1, 1, 8, 8], "INT64"), 400, "datatype 'INT64'; expected FP32"),
    ("/v2/models/digits_cnn/infer", _tensor([1, 1, 8, 8], n=10), 400, "has 10 values; shape [1, 1, 8, 8] needs 64"),
    ("/v2/models/digits_cnn/infer", _tensor([1, 1, 8, 8], name="x"), 400, "takes one input 'input' (FP32"),
    ("/v2/models/digits_cnn/infer", {"inputs": 3}, 400, "'inputs' must be a list of tensors"),
    ("/v2/models/digits_cnn/infer", b"not json", 400, "the request body is not JSON"),
    ("/v2/models/nope/infer", _tensor([1, 1, 8, 8]), 404, "unknown model 'nope'; this server has: digits_cnn"),
    ("/v2/models/digits_cnn/versions/0000/infer", _tensor([1, 1, 8, 8]), 404, "has no version '0000'"),
    ("/v2/models/nope", None, 404, "unknown model 'nope'"),
    ("/v2/nothing/here", None, 404, "no route GET /v2/nothing/here"),
    ("/v2/models/digits_cnn/promote", b"", 401, "needs the admin token (Authorization: Bearer TOKEN)"),
    ("/v2/models/digits_cnn/infer", _tensor([400, 1, 8, 8]), 413, "is over serve.max_body_mb=0.05"),
    # hostile bodies: each one line and a 400 (or 413), never a 500
    ("/v2/models/digits_cnn/infer", b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "nests JSON too deeply"),
    ("/v2/models/digits_cnn/infer", _tensor([2**61, 1, 8, 8], n=64), 413, "has 2305843009213693952 rows; a request"),
    ("/v2/models/digits_cnn/infer", _tensor([1, 1, 8, 8]) | {"parameters": [1]}, 400, "'parameters' must be a JSON"),
    ("/v2/models/digits_cnn/infer", _params([1, 1, 8, 8], "x"), 400, "input 'input': 'parameters' must be a JSON obj"),
    (
        "/v2/models/digits_cnn/infer",
        _tensor([1, 1, 8, 8]) | {"outputs": [{"name": "logits", "parameters": 3}]},
        400,
        "an output's 'parameters' must be a JSON object",
    ),
    ("/v2/models/digits_cnn/infer", _nan([1, 1, 8, 8]), 400, "input 'input' holds NaN or Inf values"),
    ("/v2/models/digits_cnn/infer", _tensor([33, 1, 8, 8], n=1), 413, "has 33 rows; a request carries at most serve."),
    # more data than the shape says, flat or in rows: refused from the list's lengths, before numpy copies it
    ("/v2/models/digits_cnn/infer", _tensor([1, 1, 8, 8], n=9000), 400, "has 9000 values; shape [1, 1, 8, 8]"),
    ("/v2/models/digits_cnn/infer", _rows([1, 1, 8, 8], 200), 400, "has more than 64 values; shape [1, 1, 8, 8]"),
]


@pytest.mark.parametrize("path,body,status,message", BAD, ids=[f"{b[2]}-{b[3][:24]}" for b in BAD])
def test_bad_requests_are_json_4xx_naming_what_was_expected(server, path, body, status, message) -> None:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    got, reply = get(server, path, data)
    assert got == status, reply
    assert message in json.loads(reply)["error"]
    assert get(server, "/v2/health/ready")[0] == 200  # still serving


def test_a_request_for_a_host_not_allowed_is_421_and_the_loopback_names_are_served(server: Server) -> None:
    # bound to 127.0.0.1 with serve.allowed_hosts unset: a page of another site whose name resolves
    # to 127.0.0.1 (DNS rebinding) sends its own name as Host
    data = json.dumps(_tensor([1, 1, 8, 8]) | {"parameters": {"priority": "high"}}).encode()  # no batch wait
    for path, body in (("/v2/models/digits_cnn", None), ("/v2/models/digits_cnn/infer", data)):
        status, reply = get(server, path, body, headers={"Host": "evil.example"})
        assert status == 421, reply
        assert json.loads(reply)["error"] == (
            "Host 'evil.example' is not one this server answers to (127.0.0.1, ::1, localhost); add 'evil.example' "
            "to serve.allowed_hosts, e.g. serve.allowed_hosts=[127.0.0.1,::1,localhost,evil.example] ([*]: any)"
        )
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", f"[::1]:{server.port}", "localhost"):
        assert get(server, "/v2/models/digits_cnn", headers={"Host": host})[0] == 200, host
        assert get(server, "/v2/models/digits_cnn/infer", data, headers={"Host": host})[0] == 200, host
    assert get(server, "/v2/health/ready", headers={"Host": "evil.example"})[0] == 200  # probes: any Host
    assert _metric(server, "fwk_serve_refused_total", reason="host") == 2


def test_bad_binary_input_and_tritonclient_errors(server: Server) -> None:
    client = _client(server)
    x = _images(1)
    head = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32", "parameters": {"binary_data_size": 512}}
            ]
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))}
    status, body = get(server, "/v2/models/digits_cnn/infer", head + x.tobytes(), headers)
    assert status == 400 and "needs 512" in json.loads(body)["error"]
    inp = triton.InferInput("input", [1, 64], "FP32")
    inp.set_data_from_numpy(x.reshape(1, 64))
    with pytest.raises(triton.InferenceServerException, match=r"expected \[-1, 1, 8, 8\]"):
        client.infer("digits_cnn", [inp])
    _infer(client, x)  # and the next request is served


def test_metrics_are_prometheus_text_per_version(server: Server, exports: Exports) -> None:
    client = _client(server)
    before = _metric(server, "fwk_serve_requests_total", version=exports.int8, code="200")
    for _ in range(3):
        _infer(client, _images(1), exports.int8, priority=1)
    assert _metric(server, "fwk_serve_requests_total", version=exports.int8, code="200") == before + 3
    assert _metric(server, "fwk_serve_request_latency_seconds_count", version=exports.int8) >= 3
    assert _metric(server, "fwk_serve_queue_delay_seconds_count", version=exports.int8) >= 3
    status, body = get(server, "/metrics")
    assert status == 200 and b"# TYPE fwk_serve_batch_size histogram" in body


def test_output_path_is_the_model_file(exports: Exports) -> None:
    assert Path(exports.output).read_bytes() == exports.model(exports.fp32).read_bytes()


def test_a_request_of_more_rows_than_a_batch_runs_in_parts_and_is_answered_whole(
    server: Server, exports: Exports
) -> None:
    client = _client(server)
    x = _images(MAX_BATCH + 9, seed=3)  # 25 rows: a batch of 16 and one of 9
    direct = ort.InferenceSession(str(exports.model(exports.fp32)), providers=["CPUExecutionProvider"])
    want = direct.run(None, {"input": x})
    np.testing.assert_allclose(_infer(client, x, priority=1), want[0], rtol=1e-5, atol=1e-5)


def test_promote_and_rollback_need_the_token_and_the_same_origin(server: Server) -> None:
    path = "/v2/models/digits_cnn/promote"
    token = admin(server)
    assert get(server, path, b"", {"Authorization": "Bearer guess"})[0] == 401
    status, body = get(server, path, b"", token | {"Origin": "http://evil.example"})
    assert status == 403 and "cross-origin request (http://evil.example) refused" in json.loads(body)["error"]
    assert get(server, path, b"", token | {"Sec-Fetch-Site": "cross-site"})[0] == 403
    status, body = get(server, path, b"", token | {"Origin": f"http://{server.url}"})  # its own page may
    assert status == 409 and "has no canary to promote" in json.loads(body)["error"]
    assert server.output().count(token["Authorization"].split()[1]) == 1  # printed once, at start
