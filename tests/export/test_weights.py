"""`fwk export --format hf|safetensors`: the trained weights in the files other tools read,
loaded back by those tools with the same outputs; and a run started from them (model.init_from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_fwk
from tests.models.test_hf import TINY

STEPS = ["train.max_steps=4", "train.eval_every=4", "checkpoint.every=4"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs root of one finished tiny hf_llama_stdlib run."""
    runs = tmp_path_factory.mktemp("llama") / "runs"
    out = run_fwk("train", *TINY, *STEPS, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    return runs


def _val_loss(runs: Path) -> float:
    (run,) = runs.glob("*/")
    return json.loads((run / "summary.json").read_text())["eval"]["val_loss"]


def test_hf_export_loads_in_transformers_with_the_same_logits(llama: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fwk.export.source import load
    from fwk.track.lookup import find_run

    out = run_fwk("export", "--format", "hf", "--output", str(tmp_path / "hf"), runs=llama)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "hf: config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json;" in (
        out.stdout
    )
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")  # the run's bytes: ids are the UTF-8 bytes
    text = "def f(x):\n\treturn 'héllo €'  \n"
    assert tokenizer(text)["input_ids"] == list(text.encode()) and tokenizer.decode(list(text.encode())) == text
    source = load(find_run(llama, None))
    ids = torch.stack([torch.as_tensor(source.data.val[i][0]) for i in range(3)])
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, source.model(ids), rtol=0, atol=1e-5)
    again = run_fwk("export", "--format", "hf", runs=llama)  # the same export: shown, not written again
    assert again.returncode == 0 and "already exists" in again.stdout, again.stdout + again.stderr
    again = run_fwk("export", "--format", "hf", "--output", str(tmp_path / "hf"), "--overwrite", runs=llama)
    assert again.returncode == 0, again.stdout + again.stderr  # an earlier export: replaced
    (tmp_path / "hf" / "notes.md").write_text("mine")
    again = run_fwk("export", "--format", "hf", "--output", str(tmp_path / "hf"), "--overwrite", runs=llama)
    assert again.returncode == 2 and "holds notes.md, which no export of this format writes" in again.stderr
    assert (tmp_path / "hf" / "notes.md").read_text() == "mine" and (tmp_path / "hf" / "config.json").is_file()


@pytest.mark.parametrize("fmt", ["hf", "safetensors"])
def test_init_from_an_export_continues_from_its_loss(llama: Path, tmp_path: Path, fmt: str) -> None:
    target = tmp_path / ("hf" if fmt == "hf" else "model.safetensors")
    out = run_fwk("export", "--format", fmt, "--output", str(target), runs=llama)
    assert out.returncode == 0, out.stdout + out.stderr
    # one step at lr 1e-12: the weights stay the exported ones, so the evaluation is the first run's
    args = [*TINY, "train.max_steps=1", "train.eval_every=1", "optim.lr=1e-12", f"model.init_from={target}"]
    out = run_fwk("train", *args, runs=tmp_path / "runs")
    assert out.returncode == 0, out.stdout + out.stderr
    assert _val_loss(tmp_path / "runs") == pytest.approx(_val_loss(llama), abs=1e-5)  # fresh weights: ~5.55


def test_weights_of_another_shape_are_one_line(llama: Path, tmp_path: Path) -> None:
    out = run_fwk("export", "--format", "safetensors", "--output", str(tmp_path / "w.safetensors"), runs=llama)
    assert out.returncode == 0, out.stdout + out.stderr
    wider = [a for a in TINY if "hidden_size" not in a] + ["model.config.hidden_size=48"]
    out = run_fwk("train", *wider, "train.max_steps=1", f"model.init_from={tmp_path / 'w.safetensors'}", runs=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith(f"fwk: error: model.init_from={tmp_path / 'w.safetensors'} does not fit the model: "), line
    assert "of another shape (e.g. " in line and " (256, 32) vs (256, 48))" in line  # the tied embedding/head


def test_safetensors_of_an_fwk_model_and_what_cannot_be_asked(tmp_path: Path) -> None:
    from safetensors.torch import load_model

    from fwk.export.source import load
    from fwk.models.build import build_model
    from fwk.track.lookup import find_run

    runs = tmp_path / "runs"
    out = run_fwk("train", "train.max_steps=2", "train.eval_every=2", "jit=off", runs=runs)  # digits_cnn
    assert out.returncode == 0, out.stdout + out.stderr
    out = run_fwk("export", "--format", "safetensors", "--output", str(tmp_path / "cnn.safetensors"), runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    source = load(find_run(runs, None))
    model = build_model(source.config.model, source.data).eval()
    load_model(model, tmp_path / "cnn.safetensors")
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.model.state_dict().values(), strict=True)
    )
    for args, message in (
        (["--format", "hf"], "--format hf writes model=hf runs; run "),
        (["--format", "hf", "--quantize", "int8"], "--quantize applies to --format onnx; --format hf exports the"),
        (["--format", "tflite"], "--format tflite is not one of onnx, aoti, hf, pt2, pte, safetensors, tensorrt"),
    ):
        out = run_fwk("export", *args, runs=runs)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.strip().splitlines()[-1].startswith(f"fwk: error: {message}"), out.stderr


def test_an_fwk_model_starts_from_its_safetensors_and_needs_them_no_more_once_trained(tmp_path: Path) -> None:
    first = ["train.max_steps=2", "train.eval_every=2", "jit=off", "precision=fp32"]  # digits_cnn
    out = run_fwk("train", *first, runs=tmp_path / "first")
    assert out.returncode == 0, out.stdout + out.stderr
    weights = tmp_path / "cnn.safetensors"
    out = run_fwk("export", "--format", "safetensors", "--output", str(weights), runs=tmp_path / "first")
    assert out.returncode == 0, out.stdout + out.stderr
    # one step at lr 1e-12: the weights stay the exported ones, so the evaluation is the first run's
    tuned = ["train.max_steps=1", "train.eval_every=1", "jit=off", "precision=fp32", "optim.lr=1e-12"]
    out = run_fwk("train", *tuned, f"model.init_from={weights}", runs=tmp_path / "tuned")
    assert out.returncode == 0, out.stdout + out.stderr
    assert _val_loss(tmp_path / "tuned") == pytest.approx(_val_loss(tmp_path / "first"), abs=1e-6)
    weights.unlink()  # the run's own checkpoint holds its weights now: export needs the file no more
    out = run_fwk(
        "export", "--format", "safetensors", "--output", str(tmp_path / "again.safetensors"), runs=tmp_path / "tuned"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    out = run_fwk("train", *tuned, f"model.init_from={weights}", runs=tmp_path / "gone")
    assert out.returncode == 2 and not (tmp_path / "gone").exists(), out.stdout + out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line == f"fwk: error: model.init_from={weights} does not exist: give a .safetensors file or a folder " + (
        "save_pretrained wrote"
    )


def _damaged(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """A real safetensors file made unreadable as ``kind`` says: model.init_from, and the file that is damaged."""
    from safetensors.torch import save_file

    good = tmp_path / "good.safetensors"
    save_file({"w": torch.zeros(64)}, good)
    data = good.read_bytes()
    if kind == "truncated":  # a copy that stopped early
        (bad := tmp_path / "w.safetensors").write_bytes(data[:-40])
    elif kind == "header":  # a header's length, then no JSON
        (bad := tmp_path / "w.safetensors").write_bytes(len(b"{not json}").to_bytes(8, "little") + b"{not json}")
    elif kind == "torch.save":
        torch.save({"w": torch.zeros(64)}, bad := tmp_path / "w.pt")
    else:  # a folder save_pretrained wrote, its model.safetensors cut short
        (tmp_path / "hf").mkdir()
        (bad := tmp_path / "hf" / "model.safetensors").write_bytes(data[:-40])
        return tmp_path / "hf", bad
    return bad, bad


DAMAGED = {
    "truncated": "damaged or truncated: Error while deserializing header: incomplete metadata, file not fully covered",
    "header": "damaged or truncated: Error while deserializing header: invalid JSON in header: key must be a string",
    "torch.save": "it is a torch.save archive; fwk loads only safetensors: Error while deserializing header: header",
    "folder": "damaged or truncated: Error while deserializing header: incomplete metadata, file not fully covered",
}


@pytest.mark.parametrize("kind", DAMAGED)
def test_init_from_a_damaged_safetensors_is_one_line_before_any_run_dir(tmp_path: Path, kind: str) -> None:
    given, bad = _damaged(tmp_path, kind)
    runs = tmp_path / "runs"
    out = run_fwk("train", "train.max_steps=1", "jit=off", f"model.init_from={given}", runs=runs)  # digits_cnn
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    [line] = out.stderr.splitlines()
    named = f"{given}: {bad}" if kind == "folder" else str(given)
    assert line.startswith(f"fwk: error: model.init_from={named} is not a readable safetensors file ({DAMAGED[kind]}")
    assert line.endswith(
        "); point model.init_from at a valid .safetensors file or a folder save_pretrained wrote, "
        "or remove model.init_from"
    )
    assert not runs.exists()  # refused from the headers alone, before anything is written


def test_a_worker_that_loads_a_damaged_safetensors_says_it_in_one_line(tmp_path: Path) -> None:
    """The weights are loaded where the model is built: a file damaged after the launcher read its
    header is the same line there."""
    from fwk.errors import UserError
    from fwk.models.weights import tensors_of

    given, _ = _damaged(tmp_path, "truncated")
    with pytest.raises(UserError, match=r"^model\.init_from=.*w\.safetensors is not a readable safetensors file \(dam"):
        tensors_of(given, str(given))


def test_a_reload_that_differs_fails_the_export_and_keeps_its_files(
    llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from fwk.export import weights
    from fwk.export.pipeline import VerificationFailed
    from fwk.track.lookup import find_run

    runs = tmp_path / "runs"
    shutil.copytree(llama, runs, ignore=shutil.ignore_patterns("exports"))  # not the exports other tests made
    from fwk.export.formats.safetensors import Safetensors

    write = Safetensors.write

    def off(self, source, out, log):  # what a lossy writer would give back
        reloaded, files = write(self, source, out, log)
        with torch.no_grad():
            next(reloaded.parameters()).add_(1e-2)
        return reloaded, files

    monkeypatch.setattr(Safetensors, "write", off)
    with pytest.raises(
        VerificationFailed, match=r"^the reloaded safetensors export differs .* by [0-9.e-]+ \(> 0.0001\)"
    ):
        weights.run_weights_export(find_run(runs, None), Safetensors(), None, False)
    (report,) = runs.glob(f"*/exports/*/{weights.REPORT}")
    assert json.loads(report.read_text())["passed"] is False and (report.parent / "model.safetensors").is_file()
