"""Trust boundaries: no file in a run directory runs code, and nothing fwk was not asked to
replace is deleted. Each case is one row: what a crafted or unlucky directory holds, what reads
it, and the one line fwk says instead of running or deleting anything."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fwk.components.checkpoint import Checkpointer, model_weights
from fwk.distributed.group import Dist
from fwk.errors import UserError

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


class _Touch:
    """Unpickled, it creates a file: the stand-in for any code a crafted file could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def _trained() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def _sharded(root: Path) -> Path:
    """A sharded (DCP) checkpoint of a small model and its optimizer, as an FSDP run saves it."""
    return Checkpointer(root, SOLO, keep=1, sharded=True).save(5, {**_trained(), "step": 5})


def _rehash(checkpoint: Path) -> None:
    """Write the manifest's checksums again, as whoever crafted the directory would."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    for name in manifest.get("sha256", {}):
        manifest["sha256"][name] = hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def _crafted_metadata(checkpoint: Path, marker: Path) -> None:
    (checkpoint / "sharded" / ".metadata").write_bytes(pickle.dumps(_Touch(marker)))
    _rehash(checkpoint)


def _wrapped_metadata(checkpoint: Path, marker: Path) -> None:
    """DCP's own Metadata with code hidden inside one of its fields."""
    path = checkpoint / "sharded" / ".metadata"
    with open(path, "rb") as f:
        metadata = pickle.load(f)  # our own file, just written
    metadata.planner_data = {"x": _Touch(marker)}
    path.write_bytes(pickle.dumps(metadata))
    _rehash(checkpoint)


def _crafted_value(checkpoint: Path, marker: Path) -> None:
    """A checkpoint saved with an object among its values, which DCP stores pickled as bytes."""
    import torch.distributed.checkpoint as dcp

    shutil.rmtree(checkpoint / "sharded")
    dcp.save({**_trained(), "extra": _Touch(marker)}, checkpoint_id=checkpoint / "sharded", no_dist=True)
    _rehash(checkpoint)


def _read_weights(checkpoint: Path) -> object:
    return model_weights(checkpoint)


def _resume(checkpoint: Path) -> object:
    template = {k: v for k, v in _trained().items()}  # what a resumed run loads into
    ckpt = Checkpointer(checkpoint.parent, SOLO, keep=1, sharded=True)
    return ckpt.load(checkpoint, lambda flat: template)


RUNS_CODE: dict[str, tuple[Callable[[Path, Path], None], Callable[[Path], object], str]] = {
    # case: (what the crafted directory holds, what reads it, the start of the one line)
    "dcp .metadata, fwk export": (_crafted_metadata, _read_weights, "checkpoint .* is refused: its sharded files name"),
    "dcp .metadata, a resume": (_crafted_metadata, _resume, "checkpoint .* is refused: its sharded files name"),
    "dcp .metadata field, fwk export": (_wrapped_metadata, _read_weights, "checkpoint .* is refused"),
    "dcp pickled value, fwk export": (
        _crafted_value,
        _read_weights,
        "checkpoint .* is refused: its sharded files name",
    ),
}


@pytest.mark.parametrize("case", list(RUNS_CODE))
def test_a_crafted_run_directory_runs_no_code(case: str, tmp_path: Path) -> None:
    craft, read, said = RUNS_CODE[case]
    checkpoint = _sharded(tmp_path / "checkpoints")
    marker = tmp_path / "code-ran"
    craft(checkpoint, marker)
    with pytest.raises(UserError, match=rf"^{said}") as err:
        read(checkpoint)
    assert not marker.exists()
    assert "\n" not in str(err.value)


def test_a_sharded_checkpoint_of_data_still_loads(tmp_path: Path) -> None:
    checkpoint = _sharded(tmp_path / "checkpoints")
    weights = model_weights(checkpoint)
    assert set(weights) == {"weight", "bias"} and weights["weight"].shape == (2, 3)
    state, _ = _resume(checkpoint)
    want = _trained()
    assert state["step"] == 5 and torch.equal(state["model"]["weight"], want["model"]["weight"])
    assert state["optimizer"]["param_groups"][0]["lr"] == want["optimizer"]["param_groups"][0]["lr"]  # bytes items
    assert torch.equal(state["optimizer"]["state"][0]["exp_avg"], want["optimizer"]["state"][0]["exp_avg"])


def _pickle_that_touches(tmp_path: Path, marker: Path) -> Path:
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(_Touch(marker)))
    return path


CONFIGS: dict[str, Callable[[Path], dict]] = {  # case: the model section a crafted config.yaml records
    "nested _target_ torch.load": lambda f: {
        "name": "custom",
        "_target_": "collections.OrderedDict",
        "x": {"_target_": "torch.load", "f": str(f), "weights_only": False},
    },
    "a section's _target_ torch.load": lambda f: {"_target_": "torch.load", "f": str(f), "weights_only": False},
    "trust_remote_code": lambda f: {"name": "hf", "config": {"trust_remote_code": True}},
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_a_recorded_config_that_asks_for_code_is_refused_unless_trusted(case: str, tmp_path: Path) -> None:
    from fwk.config.trust import check_recorded, trust

    marker = tmp_path / "code-ran"
    config = {"model": CONFIGS[case](_pickle_that_touches(tmp_path, marker)), "seed": 0}
    with pytest.raises(UserError, match=r"^run/config.yaml: model\..* pass --trust-config") as err:
        check_recorded(config, "run/config.yaml")
    assert "\n" not in str(err.value) and not marker.exists()
    trust(True)
    try:
        check_recorded(config, "run/config.yaml")  # the user said they wrote it
    finally:
        trust(False)


def test_a_sections_own_class_is_built_as_at_training() -> None:
    from fwk.config.trust import check_recorded

    check_recorded({"model": {"_target_": "my_models.Net", "width": 3}, "optim": {"_target_": "torch.optim.SGD"}}, "c")


def test_fwk_export_of_a_crafted_config_runs_nothing(tmp_path: Path) -> None:
    import yaml

    from tests.conftest import run_fwk

    runs = tmp_path / "runs"
    out = run_fwk("train", "train.max_steps=5", "train.eval_every=0", "jit=off", runs=runs)
    assert out.returncode == 0, out.stderr
    (run,) = [p for p in runs.iterdir() if (p / "config.yaml").is_file()]
    marker = tmp_path / "code-ran"
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"] = CONFIGS["nested _target_ torch.load"](_pickle_that_touches(tmp_path, marker))
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    for command in (["export", "--format", "safetensors"], ["replay", run.name]):
        out = run_fwk(*command, runs=runs)
        assert out.returncode == 2, out.stdout + out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert "model.x._target_ is a nested _target_ (torch.load)" in line and "--trust-config" in line
        assert not marker.exists()


def _home(output: Path) -> None:
    (output / ".ssh").mkdir(parents=True)
    (output / ".ssh" / "id_ed25519").write_text("key")
    (output / "notes.txt").write_text("notes")


def _export_and_more(output: Path) -> None:
    output.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (output / name).write_text(name)
    (output / "train.py").write_text("my code")


def _linked(output: Path) -> None:
    (output.parent / "elsewhere").mkdir()
    output.symlink_to(output.parent / "elsewhere")


def _a_file(output: Path) -> None:
    output.write_text("thesis")


DELETES: dict[str, tuple[Callable[[Path], None], str, bool, str]] = {
    # case: (what --output holds, its name, whether the format writes a folder, the end of the one line)
    "a home directory, --format hf": (_home, "home", True, "holds .ssh and 1 more, which no export"),
    "an export with the user's own file": (_export_and_more, "model", True, "holds train.py, which no export"),
    "a link to a folder": (_linked, "model", True, "is a symbolic link"),
    "a file where hf writes a folder": (_a_file, "thesis", True, "is a file, and this format writes a folder"),
    "a file not named as an export": (_a_file, "thesis.tex", False, r"is not named as an export .*\(\*\.onnx\)"),
}


@pytest.mark.parametrize("case", list(DELETES))
def test_overwrite_replaces_only_an_earlier_export(case: str, tmp_path: Path) -> None:
    from fwk.export.pipeline import check_output
    from fwk.export.replace import HF_FILES

    make, name, folder, said = DELETES[case]
    output = tmp_path / name
    make(output)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(UserError, match=rf"^--output {output} {said}.*left as it is") as err:
        check_output(output, True, HF_FILES if folder else ("*.onnx",), folder)
    assert "\n" not in str(err.value)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_overwrite_of_an_earlier_export_is_whole_or_not_at_all(tmp_path: Path) -> None:
    from fwk.export.pipeline import check_output
    from fwk.export.replace import HF_FILES, replace

    output = tmp_path / "model"
    output.mkdir()
    for name in ("config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (output / name).write_text("old")
    check_output(output, True, HF_FILES, folder=True)  # an earlier export, sharded: replaceable

    def fails(tmp: Path) -> None:
        tmp.mkdir()
        (tmp / "config.json").write_text("new")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        replace(output, fails)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary left
    assert (output / "config.json").read_text() == "old" and len(list(output.iterdir())) == 3

    def writes(tmp: Path) -> None:
        tmp.mkdir()
        (tmp / "config.json").write_text("new")
        (tmp / "model.safetensors").write_text("new")

    replace(output, writes)
    assert sorted(p.name for p in output.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_fwk_export_overwrite_leaves_what_is_not_an_export(tmp_path: Path) -> None:
    from tests.conftest import run_fwk

    runs = tmp_path / "runs"
    out = run_fwk("train", "train.max_steps=5", "train.eval_every=0", "jit=off", runs=runs)
    assert out.returncode == 0, out.stderr
    thesis = tmp_path / "thesis.tex"
    thesis.write_text("thesis")
    out = run_fwk("export", "--format", "safetensors", "--output", str(thesis), "--overwrite", runs=runs)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert f"--output {thesis} is not named as an export of this format is (*.safetensors)" in line
    assert thesis.read_text() == "thesis"
    weights = tmp_path / "model.safetensors"
    for _ in range(2):  # written, then replaced by --overwrite
        out = run_fwk("export", "--format", "safetensors", "--output", str(weights), "--overwrite", runs=runs)
        assert out.returncode == 0 and weights.stat().st_size > 1000, out.stdout + out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "runs", "thesis.tex"]
