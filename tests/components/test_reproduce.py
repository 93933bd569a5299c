"""train.deterministic: deterministic kernels, or (the default) cuDNN's autotuner."""

from __future__ import annotations

import os

import pytest
import torch

from fwk.components.reproduce import make_deterministic


@pytest.fixture
def backends(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """cuDNN's flags and torch's deterministic switch, restored after the test."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    calls: list[bool] = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", calls.append)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    return calls


def test_by_default_cudnn_picks_the_fastest_algorithms(backends: list[bool]) -> None:
    make_deterministic(False)
    assert torch.backends.cudnn.benchmark is True and torch.backends.cudnn.deterministic is False
    assert backends == []


def test_deterministic_turns_autotuning_off(backends: list[bool]) -> None:
    make_deterministic(True)
    assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.deterministic is True
    assert backends == [True] and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
