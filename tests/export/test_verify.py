"""Quality and latency measurement, on models whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fwk.export import verify


def _fixed(logits: np.ndarray):
    return lambda x: logits[: len(x)]


def test_quality_counts_accuracy_agreement_and_differences() -> None:
    # 4 samples, 3 classes; labels 0, 1, 2, 0
    ref = np.array([[5.0, 0, 0], [0, 5, 0], [0, 0, 5], [0, 5, 0]])  # right on 3 of 4
    other = np.array([[5.0, 0, 0], [0, 5, 0], [5, 0, 0.5], [0, 5, 0]])  # one flip vs ref (sample 2)
    data = iter([(np.zeros((4, 1), np.float32), np.array([0, 1, 2, 0]))])
    q = verify.quality({"ref": _fixed(ref), "other": _fixed(other)}, "ref", data, "classification")
    assert q["ref"].metric == 0.75 and q["ref"].agreement == 1.0 and q["ref"].max_abs_diff == 0.0
    assert q["other"].metric == 0.5 and q["other"].agreement == 0.75
    assert q["other"].max_abs_diff == 5.0 and q["other"].rel_diff == 1.0 and q["other"].samples == 4
    # cross-entropy of sample 0 under ref: -log softmax([5, 0, 0])[0]
    lse = math.log(math.exp(5) + 2)
    assert q["ref"].loss == pytest.approx((3 * (lse - 5) + (lse - 0)) / 4)


def test_quality_of_a_language_model_is_per_token_loss() -> None:
    vocab = 4
    uniform = np.zeros((2, 3, vocab))  # (B, T, V): every token equally likely
    data = iter([(np.zeros((2, 3), np.int64), np.array([[0, 1, 2], [3, 0, 1]]))])
    q = verify.quality({"ref": lambda x: uniform}, "ref", data, "lm")
    assert q["ref"].metric == pytest.approx(math.log(vocab)) and q["ref"].loss == q["ref"].metric


def test_batches_stop_at_the_limit() -> None:
    ds = torch.utils.data.TensorDataset(torch.arange(10.0).unsqueeze(1), torch.zeros(10, dtype=torch.long))
    assert [len(x) for x, _ in verify.batches(ds, 4)] == [4, 4, 2]
    assert [len(x) for x, _ in verify.batches(ds, 4, limit=2)] == [4, 4]


def test_latency_times_every_model_at_every_batch() -> None:
    calls = {"a": 0, "b": 0}

    def runner(name: str):
        def run(x: np.ndarray) -> np.ndarray:
            calls[name] += 1
            return x

        return run

    inputs = verify.latency_inputs(torch.utils.data.TensorDataset(torch.zeros(3, 2), torch.zeros(3)), 5)
    assert {b: x.shape for b, x in inputs.items()} == {1: (1, 2), 5: (5, 2)}  # cycled: the set has 3
    out = verify.latency({"a": runner("a"), "b": runner("b")}, inputs, threads=1, warmup=2, iterations=6, rounds=3)
    # per batch size: 2 warm-up + 3 rounds x (1 untimed + 2 timed)
    assert calls == {"a": 2 * (2 + 3 * 3), "b": 2 * (2 + 3 * 3)}
    for lat in (out["a"][1], out["b"][5]):
        assert 0 < lat.min_ms <= lat.p50_ms <= lat.p90_ms <= lat.max_ms
        assert len(lat.round_p50_ms) == 3  # one median per interleaved round, within the whole range
        assert all(lat.min_ms <= m <= lat.max_ms for m in lat.round_p50_ms)


def test_percentile_is_an_observed_value() -> None:
    times = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert verify._percentile(times, 0.5) == 3.0 and verify._percentile(times, 0.9) == 5.0


def test_cpu_features_and_threads() -> None:
    cpu = verify.cpu_int8_features()
    assert set(cpu) == {"capability", "vnni", "avx512", "amx"} and verify.default_threads() >= 1
