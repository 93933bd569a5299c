"""train.deterministic: deterministic kernels, or (the default) cuDNN's autotuner."""

from __future__ import annotations

import os

import pytest
import torch

from fwk.components.reproduce import deterministic


@pytest.fixture
def backends(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN's flags and torch's deterministic switch as a fresh process has them, and as
    they were after the test."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    yield
    torch.use_deterministic_algorithms(before)


def test_by_default_cudnn_picks_the_fastest_algorithms(backends: None) -> None:
    undo = deterministic(False)
    assert torch.backends.cudnn.benchmark is True and torch.backends.cudnn.deterministic is False
    assert not torch.are_deterministic_algorithms_enabled()
    undo()
    assert torch.backends.cudnn.benchmark is False


def test_deterministic_turns_autotuning_off(backends: None) -> None:
    undo = deterministic(True)
    assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.deterministic is True
    assert torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    undo()
    assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic is False


def test_a_run_after_a_deterministic_one_in_the_same_process_is_not_deterministic(backends: None) -> None:
    # fwk export retrains in the process that ran a train.deterministic=true run's export
    deterministic(True)()
    undo = deterministic(False)
    assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark is True
    undo()
