"""memory=offload: activations leave the device, come back one ahead, and the gradients equal
those of memory=none bit for bit."""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from fwk.config.schema import MemoryConfig
from fwk.models.gpt import GPT
from fwk.strategies.offload import Offload

CPU = torch.device("cpu")


def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, off: Offload | None) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    if off is None:
        loss = nn.functional.cross_entropy(model(x).flatten(0, -2), y.flatten())
        loss.backward()
    else:
        with torch.autograd.graph.saved_tensors_hooks(off.pack, off.unpack):
            loss = nn.functional.cross_entropy(model(x).flatten(0, -2), y.flatten())
            loss.backward()
        off.close()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _resnet(channels_last: bool) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(8, 3, 32, 32)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    return model, x, torch.randint(0, 10, (8,))


def _gpt() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32)
    return model, torch.randint(0, 64, (8, 32)), torch.randint(0, 64, (8, 32))


@pytest.mark.parametrize(
    "build", [lambda: _resnet(False), lambda: _resnet(True), _gpt], ids=["resnet18", "resnet18-channels-last", "gpt"]
)
@pytest.mark.parametrize("ahead", [1, 3])
def test_offloaded_gradients_equal_none_exactly_and_each_comes_back_ahead(build, ahead: int, tmp_path: Path) -> None:
    model, x, y = build()
    expected = _grads(model, x, y, None)
    ignore = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *model.buffers()]}
    off = Offload(CPU, ignore, ahead=ahead, spill_dir=str(tmp_path), min_bytes=1024)
    got = _grads(model, x, y, off)
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    assert len(off.saved) > 10 and off.offloaded_bytes > 100_000  # the activations did leave
    # backward asks for them about in forward's order reversed: nearly all were there already
    assert off.hits >= 0.9 * len(off.saved), (off.hits, len(off.saved))
    assert list(tmp_path.iterdir()) == []  # the spill file is gone with its piece


def test_an_offloaded_tensor_is_freed_and_comes_back_with_its_bytes_and_layout(tmp_path: Path) -> None:
    off = Offload(CPU, set(), spill_dir=str(tmp_path), min_bytes=0)
    t = torch.randn(4, 6, 5, 5).contiguous(memory_format=torch.channels_last)[1:]  # an offset, channels-last
    want = t.clone()
    alive = weakref.ref(t)
    handle = off.pack(t)
    del t
    handle.written.result()
    assert alive() is None  # written out: its memory went back
    (spill,) = tmp_path.iterdir()
    assert os.path.getsize(spill / "activations") == want.numel() * 4
    back = off.unpack(handle)
    assert torch.equal(back, want) and back.stride() == want.stride()
    off.close()


def test_what_is_not_worth_moving_stays() -> None:
    weight = torch.randn(512, 512)
    off = Offload(CPU, {weight.untyped_storage().data_ptr()}, min_bytes=1024)
    small, gappy = torch.randn(8), torch.randn(512, 512)[:, ::2]
    for t in (small, gappy, weight):  # under min_bytes; a view with gaps; the model's own
        assert off.pack(t) is t
    assert off.saved == []
    off.close()


def test_memory_offload_is_the_memory_strategy_that_moves_them() -> None:
    from fwk.distributed.group import Dist
    from fwk.strategies.memory import Memory

    mem = Memory(MemoryConfig(name="offload"), Dist(rank=0, local_rank=0, world_size=1, device=CPU), 8)
    model, x, y = _resnet(False)
    mem.apply(model)
    with mem.around_piece():
        nn.functional.cross_entropy(model(x), y).backward()
    assert mem.offloaded is not None and mem.offloaded.offloaded_bytes > 1_000_000


def test_a_spill_that_cannot_be_written_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fwk.errors import UserError

    off = Offload(CPU, set(), spill_dir=str(tmp_path), min_bytes=0)

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    handle = off.pack(torch.randn(64, 64))
    with pytest.raises(UserError, match=r"could not write saved activations to .*: No space left on device; free"):
        off.unpack(handle)
    off.close()
    assert list(tmp_path.iterdir()) == []


def test_what_offload_holds_stays_bounded_when_the_disk_is_slow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import time

    from fwk.strategies import offload

    write = os.pwrite

    def slow(fd: int, data: object, at: int) -> int:
        time.sleep(0.02)  # a disk slower than forward: without the bound, every tensor would wait in memory
        return write(fd, data, at)

    monkeypatch.setattr(offload.os, "pwrite", slow)
    mib = 1 << 20
    ahead = 1  # the default (memory.offload_ahead); more brings ``ahead`` back per unpack, so it runs further ahead
    off = Offload(CPU, set(), ahead=ahead, spill_dir=str(tmp_path))
    tensors = [torch.full((mib // 4,), float(i)) for i in range(10)]  # 1 MiB each
    handles = [off.pack(t) for t in tensors]
    assert off.offloaded_bytes == 10 * mib
    assert off.resident_peak <= (ahead + 1) * mib  # forward waited for the writes past ``ahead``
    for i, h in reversed(list(enumerate(handles))):  # backward's order
        assert torch.equal(off.unpack(h), tensors[i])
    # backward: ``ahead`` on the way, the one asked for and the one in use, while the last
    # ``ahead`` writes of forward may still be finishing: bounded, well under the 10 MiB moved
    assert off.resident_peak <= (2 * ahead + 2) * mib
    off.close()
