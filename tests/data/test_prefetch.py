"""DevicePrefetcher: CPU batches pass through untouched; on CUDA, batches arrive on the device."""

from __future__ import annotations

import pytest
import torch

from fwk.data.prefetch import DevicePrefetcher


def _batches(n: int):
    for i in range(n):
        yield torch.full((2, 3), float(i)), torch.tensor([i, i])


def test_cpu_batches_pass_through_as_the_same_objects():
    source = list(_batches(3))
    got = list(DevicePrefetcher(iter(source), torch.device("cpu")))
    assert len(got) == 3 and all(g is s for g, s in zip(got, source, strict=True))


def test_takes_a_batch_only_when_asked():
    """The loader's position (what a checkpoint records) is the batches the loop consumed."""
    taken = []

    def counting():
        for batch in _batches(5):
            taken.append(batch)
            yield batch

    prefetcher = DevicePrefetcher(counting(), torch.device("cpu"))
    next(prefetcher)
    next(prefetcher)
    assert len(taken) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_arrive_on_the_device_with_their_values():
    device = torch.device("cuda")
    source = [(x.pin_memory(), {"y": y.pin_memory(), "name": "b"}) for x, y in _batches(4)]
    for i, (x, extra) in enumerate(DevicePrefetcher(iter(source), device)):
        assert x.device.type == "cuda" and extra["y"].device.type == "cuda" and extra["name"] == "b"
        assert torch.equal(x.cpu(), torch.full((2, 3), float(i)))  # the compute stream waited for the copy
