"""model=hf: Hugging Face transformers models from local files (tiny configs made here),
called as fwk's own, with one-line errors for what cannot work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fwk.errors import UserError
from fwk.models import MODELS
from fwk.models.configs import HFConfig
from tests.conftest import resumes_bit_exactly, run_fwk

LLAMA = {
    "model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": True,
}  # fmt: skip
# the recipe's Llama, narrowed: what is checked is how fwk runs it, not what it learns
TINY = ["recipe=hf_llama_stdlib", "model.config.hidden_size=32", "model.config.intermediate_size=64"]
TINY += ["model.config.num_attention_heads=2", "model.config.num_key_value_heads=2", "data.seq_len=32"]
TINY += ["train.batch_size=8", "train.log_every=5", "jit=off", "precision=fp32"]


def _build(**kw) -> torch.nn.Module:
    cfg = HFConfig(**kw)
    cfg.check()
    return MODELS.get("hf").builder(cfg)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as save_pretrained writes it: config.json and model.safetensors of a tiny Llama."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    config = {k: v for k, v in LLAMA.items() if k != "model_type"}
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **config)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"task": "translation", "config": LLAMA}, "model.task=translation is not one of causal_lm, "),
        ({"init": "random", "config": LLAMA, "path": "x"}, "model.init=random is not one of pretrained, scratch"),
        ({"init": "scratch"}, "model=hf needs model.path=DIR (a folder with a config.json) or model.config with"),
        ({"config": LLAMA}, "model.init=pretrained needs model.path (a folder with weights); or model.init=scratch"),
        ({"path": "./no/such/folder"}, "model.path=./no/such/folder does not exist: give a folder holding a "),
    ],
)
def test_check_says_what_cannot_work(kw: dict, message: str) -> None:
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        HFConfig(**kw).check()


def test_a_folder_without_config_json_is_one_line_before_any_run_dir(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = run_fwk("train", "recipe=hf_llama_stdlib", f"model.path={tmp_path / 'empty'}", runs=tmp_path / "runs")
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = [x for x in out.stderr.splitlines() if x.strip()]
    assert line == (
        f"fwk: error: model.path={tmp_path / 'empty'} has no config.json: give a folder holding a Hugging Face "
        "config.json (what save_pretrained writes)"
    )
    assert not (tmp_path / "runs").exists() or not any(p.is_dir() for p in (tmp_path / "runs").iterdir())


def test_a_saved_folder_gives_its_weights_or_fresh_ones(saved: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    on_disk = load_file(saved / "model.safetensors")
    pretrained = {k.removeprefix("hf."): v for k, v in _build(path=str(saved)).state_dict().items()}
    assert all(torch.equal(pretrained[k], v) for k, v in on_disk.items())
    scratch = {k.removeprefix("hf."): v for k, v in _build(path=str(saved), init="scratch").state_dict().items()}
    assert scratch.keys() == pretrained.keys()
    assert not torch.equal(scratch["model.layers.0.mlp.up_proj.weight"], on_disk["model.layers.0.mlp.up_proj.weight"])
    shallower = _build(path=str(saved), init="scratch", config={"num_hidden_layers": 1})  # model.config on top
    assert len(shallower.hf.model.layers) == 1
    bare = tmp_path / "config-only"
    bare.mkdir()
    (bare / "config.json").write_text((saved / "config.json").read_text())
    with pytest.raises(UserError, match=f"^model.path={bare} holds no weights .*; train from its config with model"):
        _build(path=str(bare))


def test_a_name_in_the_local_cache_is_found_and_nothing_is_downloaded(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    snapshot = tmp_path / "hub" / "models--someone--tiny-llama" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        (snapshot / f).write_bytes((saved / f).read_bytes())
    (tmp_path / "hub" / "models--someone--tiny-llama" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--tiny-llama" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert len(_build(path="someone/tiny-llama").hf.model.layers) == 2
    with pytest.raises(UserError, match="^model.path=someone/other: no folder with a config.json there, and no model"):
        _build(path="someone/other")


def test_the_loss_is_the_models_own_and_its_decoder_layers_are_the_blocks() -> None:
    from fwk.optim.muon import split
    from fwk.strategies.modules import blocks

    torch.manual_seed(0)
    model = _build(init="scratch", config=LLAMA)
    idx, targets = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, 256)
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(model(idx, targets), expected)
    assert model.head_of == "hf.lm_head"  # the fp32 island and the fused loss follow it
    assert [n for n, _ in blocks(model)] == ["hf.model.layers.0", "hf.model.layers.1"]
    _, _, muon = split(model)  # Muon's: the 7 projections of each layer, not the tied embedding and head
    assert len(muon) == 14 and all(n.startswith("hf.model.layers.") for n in muon)


def test_the_chunked_cross_entropy_as_its_head_loss_gives_the_same_loss_and_gradients() -> None:
    from fwk.kernels.cross_entropy import linear_cross_entropy

    torch.manual_seed(0)
    plain = _build(init="scratch", config=LLAMA)
    chunked = _build(init="scratch", config=LLAMA)
    chunked.load_state_dict(plain.state_dict())
    chunked.head_loss = linear_cross_entropy  # what kernels=triton puts there (its PyTorch form off CUDA)
    idx, targets = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    losses = [m(idx, targets) for m in (plain, chunked)]
    torch.testing.assert_close(losses[1], losses[0])
    for loss in losses:
        loss.backward()
    grads = [dict(m.named_parameters(remove_duplicate=False)) for m in (plain, chunked)]
    grads = [{n: p.grad for n, p in g.items()} for g in grads]
    assert grads[0].keys() == grads[1].keys() and grads[0]["hf.lm_head.weight"] is not None
    for name, grad in grads[0].items():  # the tied embedding and head included
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6)


def test_classification_heads_give_logits_of_their_labels() -> None:
    bert = {"model_type": "bert", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1, "num_labels": 3}
    bert |= {"num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}
    text = _build(init="scratch", task="sequence_classification", config=bert)
    assert text(torch.randint(0, 64, (4, 10))).shape == (4, 3)
    vit = {"model_type": "vit", "image_size": 8, "patch_size": 4, "num_channels": 1, "hidden_size": 16}
    vit |= {"num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32, "num_labels": 10}
    images = _build(init="scratch", task="image_classification", config=vit)
    assert images(torch.randn(4, 1, 8, 8)).shape == (4, 10)


def test_the_recipe_trains_and_resumes_bit_exactly(tmp_path: Path) -> None:
    args = ["train", *TINY, "train.max_steps=20", "train.eval_every=10", "checkpoint.every=5", "checkpoint.keep=10"]
    straight, run, _ = resumes_bit_exactly(args, tmp_path, final_step=20)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval"]["val_loss"] < 5.0  # from ln(256) = 5.55 at the start


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_train_it(tmp_path: Path, parallel: str) -> None:
    import torch.distributed as dist

    assert dist.is_available() and dist.is_gloo_available()
    args = [*TINY, f"parallel={parallel}", "parallel.nproc_per_node=2", "train.max_steps=6", "train.eval_every=6"]
    out = run_fwk("train", *args, runs=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = tmp_path.glob("*/")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_step"] == 6 and summary["world_size"] == 2 and summary["eval"]["val_loss"] < 5.55
    assert summary["replicas_in_sync"] is True
    if parallel == "fsdp":  # a unit per decoder layer, then the root
        assert "parallel=fsdp: mesh dp_shard=2; 3 units (hf.model.layers.0, ...)" in out.stdout, out.stdout


def test_checkpointing_muon_and_the_profiler_take_its_structure(tmp_path: Path) -> None:
    args = [*TINY, "train.max_steps=2", "train.eval_every=2", "memory=checkpoint", "optim=muon"]
    out = run_fwk("train", *args, runs=tmp_path / "runs")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "memory=checkpoint of 2 modules (hf.model.layers.0, hf.model.layers.1)" in out.stdout
    out = run_fwk("profile", *TINY, runs=tmp_path / "profiled")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "hf.model.layers.0" in out.stdout and "LlamaRMSNorm" in out.stdout


def test_a_text_classifier_from_a_config_trains_on_labelled_texts_and_exports(tmp_path: Path) -> None:
    """model.config written on the command line (a BERT), data=hf with a label column, then
    the export that transformers' AutoModelForSequenceClassification loads with the same logits."""
    from transformers import AutoModelForSequenceClassification

    from fwk.export.source import load
    from fwk.track.lookup import find_run

    texts = tmp_path / "t.jsonl"
    rows = [{"text": ("x = 1\n" if i % 2 else "def f():\n    pass\n") * (1 + i % 3), "label": i % 2} for i in range(40)]
    texts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bert = "{model_type:bert,vocab_size:256,hidden_size:16,num_hidden_layers:1,num_attention_heads:2,"
    bert += "intermediate_size:32,max_position_embeddings:64,num_labels:2}"
    args = ["model=hf", "model.init=scratch", "model.task=sequence_classification", f"model.config={bert}", "data=hf"]
    args += [f"data.path={texts}", "data.label_column=label", "data.tokenizer=bytes", "data.seq_len=32"]
    args += ["data.val_every=4", "train.batch_size=8", "train.max_steps=6", "train.eval_every=6", "jit=off"]
    runs = tmp_path / "runs"
    out = run_fwk("train", *args, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = runs.glob("*/")
    assert 0 <= json.loads((run / "summary.json").read_text())["eval"]["val_acc"] <= 1
    out = run_fwk("export", "--format", "hf", "--output", str(tmp_path / "bert"), runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    source = load(find_run(runs, None))
    ids = torch.stack([source.data.val[i][0] for i in range(4)])
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "bert", local_files_only=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, source.model(ids), rtol=0, atol=1e-5)


def test_an_output_size_that_is_not_the_datas_names_the_hf_key() -> None:
    from fwk.data.base import DataBundle
    from fwk.data.hf import LabelledTexts
    from fwk.models.build import build_model

    texts = LabelledTexts(torch.randint(0, 256, (4, 8)), torch.tensor([0, 1, 0, 1]))
    data = DataBundle(train=texts, val=texts, task="classification", num_classes=2, in_memory=True)
    bert = {"model_type": "bert", "vocab_size": 256, "hidden_size": 16, "num_hidden_layers": 1, "num_labels": 3}
    bert |= {"num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}
    cfg = HFConfig(init="scratch", task="sequence_classification", config=bert)
    with pytest.raises(
        UserError, match=r"^model.config.num_labels=3 but the data has 2 classes; set model.config.num_labels=2$"
    ):
        build_model(cfg, data)
