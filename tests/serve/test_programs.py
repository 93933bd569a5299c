"""`fwk serve` of `--format pt2`, `aoti` and `pte` exports: the same protocol, batching and
checks as ONNX exports, the program run by torch or by ExecuTorch's runtime."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import run_fwk
from tests.serve.conftest import Exports, get, start_server, stop
from tests.serve.test_lm import TINY


def _program_export(runs: Path, fmt: str, *words: str) -> str:
    out = run_fwk("export", "--format", fmt, *words, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = [p for p in runs.iterdir() if (p / "config.yaml").is_file()]
    reports = [json.loads(p.read_text()) | {"id": p.parent.name} for p in run.glob("exports/*/weights_report.json")]
    (export,) = [r["id"] for r in reports if r["format"] == fmt]
    return export


@pytest.fixture(scope="module")
def programs(exports: Exports, tmp_path_factory: pytest.TempPathFactory) -> Exports:
    """The served digits run, copied without its ONNX exports, exported as pt2 (``fp32``) and aoti (``int8``)."""
    runs = tmp_path_factory.mktemp("programs") / "runs"
    shutil.copytree(exports.runs / exports.run, runs / exports.run, ignore=shutil.ignore_patterns("exports"))
    return replace(exports, runs=runs, fp32=_program_export(runs, "pt2"), int8=_program_export(runs, "aoti"))


def _infer(server, x: np.ndarray, version: str) -> tuple[int, dict]:
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    status, reply = get(server, f"/v2/models/digits_cnn/versions/{version}/infer", json.dumps(body).encode())
    return status, json.loads(reply)


def test_pt2_and_aoti_exports_are_served_with_the_programs_outputs(programs: Exports, tmp_path: Path) -> None:
    from fwk.export.reload import loader

    server = start_server(
        programs, programs.fp32, programs.int8, "--preload", "serve.warmup=1", log=tmp_path / "serve.log"
    )
    try:
        status, meta = get(server, "/v2/models/digits_cnn")
        assert status == 200, meta
        meta = json.loads(meta)
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
        assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
        x = np.random.default_rng(0).random((5, 1, 8, 8), dtype=np.float32)
        for version, fmt, name in ((programs.fp32, "pt2", "model.pt2"), (programs.int8, "aoti", "model.aoti.pt2")):
            status, reply = _infer(server, x, version)
            assert status == 200, reply
            (out,) = reply["outputs"]
            assert out["shape"] == [5, 10]
            direct = loader(fmt, programs.runs / programs.run / "exports" / version / name)
            with torch.no_grad():
                want = direct(torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(np.array(out["data"]).reshape(5, 10), want, rtol=1e-5, atol=1e-5)
        assert "ready: 2 version(s) warmed up" in server.output()
    finally:
        assert stop(server) == 0, server.output()


def test_a_pte_export_is_served_in_batches_no_larger_than_its_program_takes(programs: Exports, tmp_path: Path) -> None:
    from fwk.export.edge import loader

    runs = tmp_path / "runs"
    shutil.copytree(programs.runs / programs.run, runs / programs.run, ignore=shutil.ignore_patterns("exports"))
    version = _program_export(runs, "pte", "--quantize", "int8", "export.max_batch=4")
    pte = replace(programs, runs=runs, fp32=version, int8=version)
    server = start_server(pte, version, "--preload", "serve.warmup=1", log=tmp_path / "serve.log")
    try:
        x = np.random.default_rng(1).random((5, 1, 8, 8), dtype=np.float32)
        status, reply = _infer(server, x, version)  # 5 rows: batches of 4 and 1
        assert status == 200, reply
        (out,) = reply["outputs"]
        direct = loader(runs / programs.run / "exports" / version / "model.pte")
        want = np.concatenate([direct(torch.from_numpy(x[:4])).numpy(), direct(torch.from_numpy(x[4:])).numpy()])
        np.testing.assert_allclose(np.array(out["data"]).reshape(5, 10), want, rtol=1e-5, atol=1e-5)
        assert "ready: 1 version(s) warmed up" in server.output()
    finally:
        assert stop(server) == 0, server.output()


def test_a_pt2_language_model_refuses_ids_and_lengths_it_was_not_exported_for(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    out = run_fwk("train", *TINY, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    export = _program_export(runs, "pt2")
    (run,) = [p for p in runs.iterdir() if (p / "config.yaml").is_file()]
    lm = Exports(runs, run.name, export, export, Path())
    server = start_server(lm, export, "serve.warmup=0", log=tmp_path / "serve.log")

    def ids(values: list[int]) -> tuple[int, dict]:
        body = {"inputs": [{"name": "input", "shape": [1, len(values)], "datatype": "INT64", "data": values}]}
        status, reply = get(server, "/v2/models/gpt_stdlib/infer", json.dumps(body).encode())
        return status, json.loads(reply)

    try:
        bad_id, too_long, good = ids([1, 999, 2]), ids([1] * 17), ids(list(range(16)))
    finally:
        stop(server)
    assert bad_id == (400, {"error": "input 'input' holds token id 999; the model takes ids 0..255"})
    # data.seq_len=16: the program's sequence axis was captured up to 16
    assert too_long == (400, {"error": "input 'input' has 17 positions on dimension 1; the model takes at most 16"})
    assert good[0] == 200 and good[1]["outputs"][0]["shape"] == [1, 16, 256]
