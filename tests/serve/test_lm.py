"""A language model served (a tiny gpt_stdlib export): token ids are checked against its
embedding table before a request joins a batch, so one bad id fails alone."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_fwk
from tests.serve.conftest import QUICK, Exports, get, start_server, stop

TINY = ["recipe=gpt_stdlib", "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "data.seq_len=16"]
TINY += ["train.max_steps=2", "train.eval_every=0", "train.eval_batches=1", "jit=off"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Exports:
    runs = tmp_path_factory.mktemp("lm") / "runs"
    out = run_fwk("train", *TINY, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = [p for p in runs.iterdir() if (p / "config.yaml").is_file()]
    out = run_fwk("export", run.name, "--quantize", "none", "--max-accuracy-drop", "100", *QUICK, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    (export,) = [p.name for p in (run / "exports").iterdir() if p.is_dir()]
    return Exports(runs, run.name, export, export, Path())


def _ids(ids: list[int]) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "input", "shape": [1, len(ids)], "datatype": "INT64", "data": ids}]}
    ).encode()


def test_a_huge_shape_and_more_positions_than_the_model_has_are_400s(lm: Exports, tmp_path: Path) -> None:
    server = start_server(lm, lm.fp32, "serve.warmup=0", log=tmp_path / "serve.log")
    try:
        body = {"inputs": [{"name": "input", "shape": [2, 2**62], "datatype": "INT64", "data": []}]}
        huge = get(server, "/v2/models/gpt_stdlib/infer", json.dumps(body).encode())
        longer = get(server, "/v2/models/gpt_stdlib/infer", _ids([1] * 129))
        whole = get(server, "/v2/models/gpt_stdlib/infer", _ids([1] * 128))
    finally:
        stop(server)
    assert huge[0] == 400 and json.loads(huge[1])["error"] == (  # checked before its values are read
        "input 'input' has 4611686018427387904 positions on dimension 1; the model takes at most 128"
    )
    assert longer[0] == 400 and json.loads(longer[1])["error"] == (
        "input 'input' has 129 positions on dimension 1; the model takes at most 128"
    )
    assert whole[0] == 200


def test_the_graph_bounds_ids_by_the_embedding_and_positions_by_the_position_table(lm: Exports) -> None:
    from fwk.serve.limits import Limits, read

    assert read(lm.model(lm.fp32), "input", 2) == Limits(256, (-1, 128))  # bytes; model.block_size=128 positions


def test_one_out_of_range_id_fails_alone_among_good_requests(lm: Exports, tmp_path: Path) -> None:
    server = start_server(lm, lm.fp32, "serve.max_delay_ms=50", "serve.warmup=0", log=tmp_path / "serve.log")
    try:
        good = [_ids([(7 * i + j) % 256 for j in range(16)]) for i in range(16)]
        bodies = good[:8] + [_ids([1, 2, 999] + [3] * 13)] + good[8:]
        with ThreadPoolExecutor(17) as pool:
            replies = list(pool.map(lambda b: get(server, "/v2/models/gpt_stdlib/infer", b), bodies))
        status, body = replies.pop(8)
        assert status == 400 and json.loads(body)["error"] == (
            "input 'input' holds token id 999; the model takes ids 0..255"
        )
        assert [s for s, _ in replies] == [200] * 16
        logits = np.array(json.loads(replies[0][1])["outputs"][0]["data"])
        assert logits.size == 16 * 256 and np.isfinite(logits).all()
    finally:
        stop(server)
