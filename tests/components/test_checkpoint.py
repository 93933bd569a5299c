"""Checkpoints: round trip, RNG restore, last-K pruning, corruption: fallback or a clear error."""

import errno
import json
import os
import random
from pathlib import Path

import pytest
import torch

from fwk.components.checkpoint import Checkpointer, RewindPoint
from fwk.components.train_state import set_rng_state
from fwk.distributed.group import Dist
from fwk.errors import UserError

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _state(step: int) -> dict:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}


def test_round_trip_and_rng(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, SOLO, keep=2)
    torch.manual_seed(3)
    random.seed(3)
    state = _state(10)
    path = ckpt.save(10, state)
    expected = (torch.rand(3), random.random())
    loaded, rng = ckpt.load(path)
    assert loaded["step"] == 10
    for k, v in state["model"].items():
        assert torch.equal(loaded["model"][k], v)
    assert loaded["optimizer"]["state"][0]["exp_avg"].equal(state["optimizer"]["state"][0]["exp_avg"])
    set_rng_state(rng)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_keeps_last_k_and_ignores_partial(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, SOLO, keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, _state(step))
    (tmp_path / ".tmp-step-00000004").mkdir()  # a crash mid-save leaves only a temp dir
    assert [p.name for p in ckpt.all()] == ["step-00000002", "step-00000003"]
    assert ckpt.latest().name == "step-00000003"


def _corrupt(path: Path, name: str = "state.pt") -> None:
    data = bytearray((path / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / name).write_bytes(bytes(data))


def test_corrupt_checkpoint_is_one_line_error(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, SOLO, keep=2, on_corrupt="error")
    path = ckpt.save(5, _state(5))
    _corrupt(path)
    with pytest.raises(UserError, match="corrupt .*state.pt.*checksum") as err:
        ckpt.load_latest()
    assert "\n" not in str(err.value)
    assert (path / "state.pt").exists()  # nothing deleted


def test_corrupt_newest_falls_back_to_the_newest_intact(tmp_path: Path, said: pytest.LogCaptureFixture) -> None:
    ckpt = Checkpointer(tmp_path, SOLO, keep=3, on_corrupt="fallback")
    for step in (1, 2, 3):
        ckpt.save(step, _state(step))
    _corrupt(tmp_path / "step-00000003", "rng-rank0.pt")
    (tmp_path / "step-00000002" / "state.pt").unlink()  # cut off mid-write: a file missing
    path, state, _ = ckpt.load_latest()
    assert (path.name, state["step"]) == ("step-00000001", 1)
    assert said.messages == [
        "warning: skipped corrupt checkpoint step-00000003 (rng-rank0.pt: missing or checksum mismatch), "
        "step-00000002 (state.pt: missing or checksum mismatch); resuming from step-00000001 instead"
    ]
    assert (tmp_path / "step-00000003" / "rng-rank0.pt").exists()  # nothing deleted


def test_every_checkpoint_corrupt_is_one_line_error(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, SOLO, keep=2, on_corrupt="fallback")
    _corrupt(ckpt.save(4, _state(4)))
    with pytest.raises(UserError, match="every checkpoint in .* is corrupt .newest: step-00000004"):
        ckpt.load_latest()


def test_an_unsharded_checkpoint_loads_on_another_world_size(tmp_path: Path) -> None:
    # every rank holds the whole model: any number of processes reads it; the per-rank RNG
    # streams are the written world's, so none is restored (the trainer derives fresh ones)
    state = _state(1)
    path = Checkpointer(tmp_path, SOLO, keep=1).save(1, state)
    other = Checkpointer(tmp_path, Dist(0, 0, 2, torch.device("cpu")), keep=1)
    loaded, rng = other.load(path)
    assert loaded["step"] == 1 and rng is None
    assert all(torch.equal(a, b) for a, b in zip(loaded["model"].values(), state["model"].values(), strict=True))


def test_layout_mismatch_is_one_line_error(tmp_path: Path) -> None:
    """A checkpoint of a DDP run does not load into a sharded one. (One process's whole
    tensors do, and a sharded checkpoint loads into any run: tests/engine/test_resize.py.)"""
    path = Checkpointer(tmp_path, SOLO, keep=1).save(1, _state(1))
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "world_size": 2}))  # as 2 DDP processes write it
    sharded = Checkpointer(tmp_path, SOLO, keep=1, sharded=True)
    with pytest.raises(UserError, match=r"is unsharded \(parallel=ddp, or one process\) but this run is ") as err:
        sharded.load_latest()
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_rewind_point_saves_weights_once(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    point = RewindPoint(tmp_path / "rewind", SOLO, rewind_at=0.02, max_steps=500)
    assert point.step == 10
    point.after(9, model)
    assert not (tmp_path / "rewind").exists()
    point.after(10, model)
    saved = torch.load(tmp_path / "rewind" / "step-00000010.pt", weights_only=True)
    assert saved["step"] == 10
    assert saved["model"].keys() == model.state_dict().keys()
    assert all(torch.equal(saved["model"][k], v) for k, v in model.state_dict().items())
    with torch.no_grad():  # a resumed run passing the step again leaves the file as it was
        model[0].weight.add_(1.0)
    point.after(10, model)
    again = torch.load(tmp_path / "rewind" / "step-00000010.pt", weights_only=True)
    assert torch.equal(again["model"]["0.weight"], saved["model"]["0.weight"])
    assert RewindPoint(tmp_path / "rewind", SOLO, rewind_at=0.02, max_steps=500).done  # decided up front


def test_rewind_point_off_and_at_least_step_one(tmp_path: Path) -> None:
    assert RewindPoint(tmp_path, SOLO, rewind_at=0.0, max_steps=500).step is None
    assert RewindPoint(tmp_path, SOLO, rewind_at=0.02, max_steps=10).step == 1


# ---- storage faults: a save cut short, a full disk ---------------------------------------
def _weights(path: Path) -> torch.Tensor:
    return torch.load(path / "state.pt", weights_only=True)["model"]["weight"]


def test_a_resave_cut_between_its_renames_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture
) -> None:
    """Re-saving a step (the final one, after a stop) moves the old copy aside and deletes it
    only once the new one is in: a crash in between leaves the old copy, put back at start."""
    ckpt = Checkpointer(tmp_path, SOLO, keep=2)
    old = _weights(ckpt.save(7, _state(7)))
    renames = []
    real_rename = os.rename

    def crash_on_second(src: Path, dst: Path) -> None:
        renames.append((Path(src).name, Path(dst).name))
        if len(renames) == 2:  # the old copy is aside, the new one not yet in
            raise KeyboardInterrupt("killed")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(7, _state(7))
    monkeypatch.setattr(os, "rename", real_rename)
    assert renames == [("step-00000007", ".old-step-00000007"), (".tmp-step-00000007", "step-00000007")]
    assert ckpt.all() == []  # what a resume would have found before: nothing
    said.clear()
    path, state, _ = Checkpointer(tmp_path, SOLO, keep=2).load_latest()
    assert path.name == "step-00000007" and torch.equal(state["model"]["weight"], old)
    assert said.messages == [
        "checkpoints: put back step-00000007 (its re-save was cut short)",
        "checkpoints: removed .tmp-step-00000007 (a save cut short)",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000007"]
    new = _weights(ckpt.save(7, _state(7)))  # and a re-save that completes replaces it
    assert not torch.equal(new, old) and torch.equal(_weights(ckpt.latest()), new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000007"]


def _wide(step: int) -> dict:
    """A state whose files are larger than the file-size limit below: 256 KiB of weights."""
    torch.manual_seed(step)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}


_SAVE_LIMITED = """
import resource, sys, torch
from pathlib import Path
from fwk.components.checkpoint import Checkpointer
from fwk.errors import UserError
from tests.components.test_checkpoint import SOLO, _wide
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # a real limit: the kernel refuses the write (EFBIG)
try:
    Checkpointer(Path(sys.argv[1]), SOLO, keep=2, sharded=sys.argv[2] == "sharded").save(8, _wide(8))
except UserError as exc:
    print(exc)
    sys.exit(2)
"""


@pytest.mark.parametrize("layout", ["plain", "sharded"])
def test_a_save_the_file_system_refuses_is_one_line_and_resumes_from_the_last_checkpoint(
    tmp_path: Path, layout: str
) -> None:
    """torch.save raises a RuntimeError and dcp.save a CheckpointException, neither an OSError."""
    import subprocess
    import sys

    ckpt = Checkpointer(tmp_path, SOLO, keep=2, sharded=layout == "sharded")
    ckpt.save(4, _wide(4))
    out = subprocess.run([sys.executable, "-c", _SAVE_LIMITED, str(tmp_path), layout], capture_output=True, text=True)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stdout.strip().splitlines()
    assert line.startswith(f"the file system of {tmp_path} refused a write while saving step-00000008 (File too large;")
    assert line.endswith(
        "the unfinished copy is removed and step-00000004 is intact; raise the file-size limit (ulimit -f), then run "
        "the same command to resume"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004"]
    path, state, _ = Checkpointer(tmp_path, SOLO, keep=2, sharded=layout == "sharded").load_latest(
        lambda flat: {k: v for k, v in _wide(0).items() if k != "step"}  # what a resumed run loads shards into
    )
    assert path.name == "step-00000004" and state["step"] == 4
    assert torch.equal(state["model"]["weight"], _wide(4)["model"]["weight"])


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_disk_that_fills_during_a_save_is_one_line_and_keeps_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    ckpt = Checkpointer(tmp_path, SOLO, keep=2)
    kept = _weights(ckpt.save(4, _state(4)))
    real_save = torch.save

    def fills(obj: object, f: Path, *args: object, **kwargs: object) -> None:
        if Path(f).name == "state.pt":
            Path(f).write_bytes(b"\0" * 100)  # part of the file made it to disk
            raise OSError(code, os.strerror(code))
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", fills)
    with pytest.raises(UserError) as err:
        ckpt.save(8, _state(8))
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        f"no space left on the device of {tmp_path} while saving step-00000008 ({os.strerror(code)};"
    )
    assert message.endswith(
        "the unfinished copy is removed and step-00000004 is intact; free some space, then run the same command "
        "to resume"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004"]
    monkeypatch.setattr(torch, "save", real_save)
    path, state, _ = Checkpointer(tmp_path, SOLO, keep=2).load_latest()
    assert path.name == "step-00000004" and torch.equal(state["model"]["weight"], kept)
