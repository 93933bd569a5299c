"""Early exit, served: accuracy, mean depth and batch-1 latency of a recipe trained with exits
against the same recipe without, through ``fwk serve``, in one run.

    .venv/bin/python -m benchmarks --only early_exit --txt bench/cpu/early_exit.txt

For each case (``resnet_digits``; ``gpt_stdlib`` at 4 layers, so that it has an exit each
quarter) two runs with the same seed and steps: one plain, one with ``methods=[early_exit]``.
Each is exported to ONNX fp32 (``--quantize none``; int8's calibration cannot enter the exits'
branches) and served by its own ``fwk serve`` with batching off (``serve.max_batch_size=1``):
the batch-1 latency a user's client sees. One client sends the validation samples one at a
time over keep-alive HTTP, a whole pass to one server, then to the other, the order
alternating by rep (``measure_pair``); a pass's figure is its p50 latency, and the row is the
median of the per-rep ratios plain/exits (> 1: the exits are faster).

The accuracy (for the LM: the mean loss per token) is computed from the outputs the client
received. The mean depth is the share of the blocks the served program ran per request: each
sample, sent alone, leaves at the first exit where it (every token of it) is below the
threshold, as the export's report counts them. A token sequence leaves only when all of its
tokens are confident, which is why an LM gains little here.
"""

from __future__ import annotations

import http.client
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

CASES = {
    "resnet_digits": ["recipe=resnet_digits"],
    "gpt_stdlib": ["recipe=gpt_stdlib", "model.n_layer=4", "train.max_steps=300", "train.eval_every=300"],
}
QUICK = {"resnet_digits": ["train.max_steps=20"], "gpt_stdlib": ["train.max_steps=40", "train.eval_every=40"]}
SAMPLES = 200  # validation samples per pass, spread over the split


def _trained(words: list[str], runs: Path) -> str:
    from benchmarks.serve import _fwk

    print(f"training {' '.join(words)} under {runs} ...", file=sys.stderr, flush=True)
    out = _fwk("train", *words, runs=runs)
    return re.search(r"run ([0-9a-f]{10}) (?:complete|is already complete)", out).group(1)


def _exported(run: str, runs: Path) -> tuple[str, dict]:
    """Export ``run`` to ONNX fp32 and return the export id and its report."""
    from benchmarks.serve import _fwk

    out = _fwk("export", run, "--quantize", "none", "--max-accuracy-drop", "100", runs=runs)
    eid = re.search(r"export dir: .*/exports/([0-9a-f]{10})", out).group(1)
    return eid, json.loads((runs / run / "exports" / eid / "export_report.json").read_text())


def _samples(run: str, runs: Path) -> tuple[list[np.ndarray], list[np.ndarray], str]:
    """``SAMPLES`` validation samples spread evenly over the split (inputs as a batch of one,
    targets), and the run's task. The split's first samples are one file's, for the text sets."""
    from fwk.export.source import load
    from fwk.track.lookup import find_run

    source = load(find_run(runs, run))
    val = source.data.val
    pairs = [val[int(i)] for i in np.unique(np.linspace(0, len(val) - 1, SAMPLES).round())]
    xs = [np.asarray(x)[None] for x, _ in pairs]
    return (
        [x.astype(np.float32) if x.dtype.kind == "f" else x.astype(np.int64) for x in xs],
        [np.asarray(y) for _, y in pairs],
        source.data.task,
    )


class Client:
    """One keep-alive connection sending one sample per request (the binary tensor extension)."""

    def __init__(self, port: int, model: str) -> None:
        self.port, self.model = port, model
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def reconnect(self) -> None:
        """A new connection: the server closes one left idle (keep-alive timeout) while the other side's pass ran."""
        self.conn.close()
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        datatype = "FP32" if x.dtype == np.float32 else "INT64"
        tensor = {"name": "input", "shape": list(x.shape), "datatype": datatype}
        tensor["parameters"] = {"binary_data_size": x.nbytes}
        head = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
        headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
        self.conn.request("POST", f"/v2/models/{self.model}/infer", head + x.tobytes(), headers)
        reply = self.conn.getresponse()
        body = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"fwk serve answered {reply.status}: {body[:200]!r}")
        n = int(reply.getheader("Inference-Header-Content-Length"))
        (out,) = json.loads(body[:n])["outputs"]
        return np.frombuffer(body[n:], dtype=np.float32).reshape(out["shape"])


def _pass(client: Client, xs: list[np.ndarray], outputs: list) -> float:
    """Send every sample once; return the p50 latency in ms, and keep the outputs of the first pass."""
    import time

    latencies = []
    client.reconnect()
    for x in xs:
        t0 = time.perf_counter()
        got = client(x)
        latencies.append(time.perf_counter() - t0)
        if len(outputs) < len(xs):
            outputs.append(got)
    return float(np.percentile(np.array(latencies) * 1000, 50))


def _quality(outputs: list[np.ndarray], ys: list[np.ndarray], task: str) -> float:
    """Accuracy of the served outputs, or for an LM the mean loss per token (nats)."""
    if task != "lm":
        return float(np.mean([int(o.reshape(-1).argmax() == int(y)) for o, y in zip(outputs, ys, strict=True)]))
    losses = []
    for o, y in zip(outputs, ys, strict=True):
        z = o.reshape(-1, o.shape[-1]).astype(np.float64)
        z = z - z.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        losses.append(-logp[np.arange(len(y.reshape(-1))), y.reshape(-1)])
    return float(np.concatenate(losses).mean())


def mean_depth(exits: dict | None) -> float:
    """The share of the blocks run per request, from where the report's samples left one at a time."""
    if not exits:
        return 1.0
    counts = exits["held_out_alone_leave_at"]
    share = [(b + 1) / exits["blocks"] for b in exits["after_blocks"]] + [1.0]
    return sum(c * s for c, s in zip(counts, share, strict=True)) / max(sum(counts), 1)


def case_rows(case: str, quick: bool, runs: Path) -> list:
    from benchmarks.harness import Side, measure_pair, ratio_row
    from benchmarks.serve import start

    words = CASES[case] + (QUICK[case] if quick else [])
    runs_by = {"plain": _trained(words, runs), "exits": _trained([*words, "methods=[early_exit]"], runs)}
    exports = {side: _exported(run, runs) for side, run in runs_by.items()}
    xs, ys, task = _samples(runs_by["exits"], runs)
    servers = {side: start(eid, runs, ["serve.max_batch_size=1"]) for side, (eid, _) in exports.items()}
    try:
        clients = {side: Client(port, exports[side][1]["recipe"]) for side, (_, port) in servers.items()}
        outputs: dict[str, list] = {"plain": [], "exits": []}
        pair = measure_pair(
            lambda: _pass(clients["exits"], xs, outputs["exits"]),
            lambda: _pass(clients["plain"], xs, outputs["plain"]),
            reps=3 if quick else 5,
        )
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    quality = {side: _quality(outputs[side], ys, task) for side in outputs}
    summary = json.loads((runs / runs_by["exits"] / "summary.json").read_text())["early_exit"]
    exits = exports["exits"][1]["exits"]
    depth = mean_depth(exits)
    what = "val loss (nats/token)" if task == "lm" else "val acc"
    full = summary["full"]
    notes = (
        f"{len(xs)} val samples, one per request; {what} served: {quality['exits']:.4f} with exits, "
        f"{quality['plain']:.4f} plain (the exit run's full model {full:.4f}, max_drop {summary['max_drop']:g}); "
        f"exits after blocks {exits['after_blocks']} of {exits['blocks']}, threshold {exits['threshold']:.3g} nats; "
        f"mean depth served at batch 1 {depth:.2f} (calibrated per {'token' if task == 'lm' else 'sample'}: "
        f"{summary['mean_depth']:.2f}); samples leaving at each exit and the end: {exits['held_out_alone_leave_at']}"
    )
    ratios = [b / a for a, b in zip(pair.a, pair.b, strict=True)]
    return [
        ratio_row(
            "early_exit",
            f"{case} served batch-1 p50 latency, plain / with exits",
            ratios,
            Side("with exits", float(np.median(pair.a)), "ms p50"),
            Side("plain", float(np.median(pair.b)), "ms p50"),
            "plain ms/exits ms (speed)",
            notes=notes,
        )
    ]


def rows(quick: bool, cases: list[str] | None = None) -> list:
    """For the harness: each case's row, trained, exported and served in a temporary runs root."""
    from benchmarks.harness import guarded

    out = []
    with tempfile.TemporaryDirectory(prefix="fwk-bench-early-exit-") as tmp:
        for case in cases or list(CASES):
            out += guarded("early_exit", case, lambda case=case: case_rows(case, quick, Path(tmp) / case))
    return out
