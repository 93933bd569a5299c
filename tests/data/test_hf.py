"""data=hf: local Parquet, JSON Lines, CSV, text and save_to_disk data read with datasets,
tokenized (bytes, or a tokenizer folder made here) and packed, or labelled for classification;
then the whole path a user takes: a local HF model folder, its tokenizer, train, export, reload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fwk.data import DATA
from fwk.data.configs import HFDataConfig
from fwk.errors import UserError
from tests.conftest import resumes_bit_exactly, run_fwk
from tests.models.test_hf import LLAMA

TEXTS = [f"def f{i}(x):\n    return x * {i}  # {'é' * (i % 3)}\n" for i in range(12)]
LABELS = ["short" if i % 3 else "long" for i in range(12)]


def _build(**kw) -> object:
    return DATA.get("hf").builder(HFDataConfig(**kw), seed=0)


def _jsonl(path: Path, texts: list[str] = TEXTS) -> Path:
    path.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in zip(texts, LABELS, strict=True)))
    return path


def _bytes(texts: list[str]) -> torch.Tensor:
    return torch.tensor(list(b"".join(t.encode() + b"\n" for t in texts)), dtype=torch.int32)


def tokenizer_folder(folder: Path, texts: list[str]) -> Path:
    """A byte-level BPE tokenizer trained here on ``texts``, saved as transformers does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>", "<pad>"], initial_alphabet=alphabet)
    tk.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return folder


def test_texts_are_packed_as_bytes_and_every_nth_is_val(tmp_path: Path) -> None:
    data = _build(path=str(_jsonl(tmp_path / "t.jsonl")), tokenizer="bytes", seq_len=16, val_every=4)
    assert data.task == "lm" and data.num_classes == 256
    assert torch.equal(data.train.data, _bytes([t for i, t in enumerate(TEXTS) if (i + 1) % 4]))
    assert torch.equal(data.val.data, _bytes([t for i, t in enumerate(TEXTS) if (i + 1) % 4 == 0]))
    x, y = data.train[1]
    assert x.dtype == torch.int64 and x.shape == (16,) and torch.equal(x[1:], y[:-1])


def test_every_format_gives_the_same_tokens(tmp_path: Path) -> None:
    import datasets

    table = datasets.Dataset.from_dict({"text": TEXTS, "label": LABELS})
    table.to_parquet(tmp_path / "t.parquet")
    table.to_csv(tmp_path / "t.csv", index=False)
    table.save_to_disk(tmp_path / "saved")
    for i, t in enumerate(TEXTS):
        (tmp_path / "txt").mkdir(exist_ok=True)
        (tmp_path / "txt" / f"{i:02d}.txt").write_text(t)  # a text file is one text
    want = _build(path=str(_jsonl(tmp_path / "t.jsonl")), tokenizer="bytes", seq_len=16, val_every=4).train.data
    for path in ("t.parquet", "t.csv", "saved", "txt/*.txt"):
        got = _build(path=str(tmp_path / path), tokenizer="bytes", seq_len=16, val_every=4).train.data
        assert torch.equal(got, want), path


def test_a_saved_folder_stays_as_it_was_and_its_tokens_are_cached_once(tmp_path: Path) -> None:
    import datasets

    from fwk.track.store import cache_root

    datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(tmp_path / "saved")
    cfg = HFDataConfig(path=str(tmp_path / "saved"), tokenizer="bytes", seq_len=16, val_every=4)
    before = sorted(p.name for p in (tmp_path / "saved").iterdir())
    fingerprint = cfg.fingerprint()
    first = DATA.get("hf").builder(cfg, seed=0)
    cached = sorted((cache_root() / "hf-tokens").iterdir())
    again = DATA.get("hf").builder(cfg, seed=0)
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == before  # a read-only folder would do
    assert cfg.fingerprint() == fingerprint  # so the same command finds the same run
    assert sorted((cache_root() / "hf-tokens").iterdir()) == cached and len(cached) == 2  # train, val: read back
    assert torch.equal(first.train.data, again.train.data)


def test_a_validation_split_of_the_data_is_the_val_set(tmp_path: Path) -> None:
    import datasets

    train = datasets.Dataset.from_dict({"text": TEXTS[:8]})
    datasets.DatasetDict({"train": train, "validation": datasets.Dataset.from_dict({"text": TEXTS[8:]})}).save_to_disk(
        tmp_path / "split"
    )
    data = _build(path=str(tmp_path / "split"), tokenizer="bytes", seq_len=8)
    assert torch.equal(data.train.data, _bytes(TEXTS[:8])) and torch.equal(data.val.data, _bytes(TEXTS[8:]))


def test_a_tokenizer_folder_tokenizes_and_ends_each_text(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = tokenizer_folder(tmp_path / "tok", TEXTS)
    data = _build(path=str(_jsonl(tmp_path / "t.jsonl")), tokenizer=str(folder), seq_len=8, val_every=2)
    tok = AutoTokenizer.from_pretrained(folder)
    eos = tok.eos_token_id
    want = [i for t in TEXTS[0::2] for i in tok(t, add_special_tokens=False)["input_ids"] + [eos]]
    assert data.train.data.tolist() == want and data.num_classes == len(tok) > 256


def test_a_label_column_makes_a_classification_set(tmp_path: Path) -> None:
    data = _build(
        path=str(_jsonl(tmp_path / "t.jsonl")), tokenizer="bytes", label_column="label", seq_len=24, val_every=4
    )
    assert data.task == "classification" and data.num_classes == 2
    x, y = data.train[0]
    assert x.shape == (24,) and x[:24].tolist() == list(TEXTS[0].encode()[:24]) and y.item() == 0  # "long"
    x, y = data.train[1]
    assert y.item() == 1  # "short": the labels in sorted order
    padded = _build(
        path=str(_jsonl(tmp_path / "t.jsonl")), tokenizer="bytes", label_column="label", seq_len=64, val_every=4
    )
    n = len(TEXTS[0].encode())
    assert padded.train[0][0][n:].eq(0).all()  # bytes pad with 0


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"path": ""}, "data=hf needs data.path: a .parquet, .jsonl, .csv or .txt file, or a save_to_disk folder"),
        ({"path": "/no/such.jsonl"}, "data.path=/no/such.jsonl matches no file; give a .parquet, .jsonl, "),
        ({"text_column": "body"}, "data.text_column=body: the data has no such column; its columns: text, label"),
        ({"label_column": "kind"}, "data.label_column=kind: the data has no such column; its columns: text, label"),
        ({"tokenizer": "/no/tokenizer"}, "data.tokenizer=/no/tokenizer: no folder with a tokenizer_config.json"),
    ],
)
def test_what_cannot_work_is_one_line(tmp_path: Path, kw: dict, message: str) -> None:
    kw = {"path": str(_jsonl(tmp_path / "t.jsonl")), "tokenizer": "bytes", "val_every": 4} | kw
    with pytest.raises(UserError, match="^" + message.replace(".", r"\.")):
        _build(**kw)


def test_the_llama_recipe_on_hf_data_resumes_bit_exactly(tmp_path: Path) -> None:
    texts = _jsonl(tmp_path / "t.jsonl", [t * 8 for t in TEXTS])
    args = ["train", "recipe=hf_llama_stdlib", "data=hf", f"data.path={texts}", "data.seq_len=32", "data.val_every=4"]
    args += ["model.config.hidden_size=32", "model.config.intermediate_size=64", "model.config.num_attention_heads=2"]
    args += ["model.config.num_key_value_heads=2", "train.batch_size=4", "train.max_steps=16", "train.eval_every=8"]
    args += ["train.log_every=4", "checkpoint.every=4", "checkpoint.keep=10", "jit=off", "precision=fp32"]
    straight, run, _ = resumes_bit_exactly(args, tmp_path, final_step=16)
    assert "data=hf: " in straight.stdout and "(bytes, vocabulary 256)" in straight.stdout


def test_a_local_model_folder_with_its_tokenizer_trains_exports_and_reloads(tmp_path: Path) -> None:
    """The issue's path: fwk train model=hf model.path=DIR data=hf data.path=FILE; fwk export --format hf."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model_dir = tokenizer_folder(tmp_path / "my-model", TEXTS)
    config = {k: v for k, v in LLAMA.items() if k != "model_type"} | {"vocab_size": 300}
    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **config)).save_pretrained(model_dir)
    runs = tmp_path / "runs"
    args = ["model=hf", f"model.path={model_dir}", "data=hf", f"data.path={_jsonl(tmp_path / 't.jsonl')}"]
    args += ["data.seq_len=16", "data.val_every=3", "train.max_steps=4", "train.eval_every=4", "train.batch_size=4"]
    out = run_fwk("train", *args, "jit=off", runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    vocab = len(AutoTokenizer.from_pretrained(model_dir))  # under the model's 300: a padded vocabulary is fine
    assert f"({model_dir}, vocabulary {vocab})" in out.stdout and vocab < 300, out.stdout  # the folder's tokenizer
    out = run_fwk("export", "--format", "hf", "--output", str(tmp_path / "trained"), runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert {"tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= {
        p.name for p in (tmp_path / "trained").iterdir()
    }
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "trained", local_files_only=True)
    assert reloaded.config.vocab_size == 300


def test_a_model_folder_without_a_tokenizer_names_data_tokenizer_bytes(tmp_path: Path) -> None:
    """model=hf data=hf takes model.path's tokenizer; a folder with none is one line that says
    the fix needing no files too."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = tmp_path / "no-tokenizer"
    config = {k: v for k, v in LLAMA.items() if k != "model_type"} | {"vocab_size": 300}
    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **config)).save_pretrained(model_dir)
    args = ["model=hf", f"model.path={model_dir}", "data=hf", f"data.path={_jsonl(tmp_path / 't.jsonl')}"]
    args += ["data.seq_len=16", "data.val_every=3", "train.max_steps=1", "train.batch_size=4", "jit=off"]
    out = run_fwk("train", *args, runs=tmp_path)
    assert (out.returncode, out.stderr.count("\n")) == (2, 1), out.stdout + out.stderr
    assert out.stderr == (
        f"fwk: error: data.tokenizer={model_dir}: no folder with a tokenizer_config.json there, and no model of that "
        "name in the local Hugging Face cache; fwk never downloads: fetch it first (hf download NAME), give the "
        "folder save_pretrained wrote or set data.tokenizer=bytes (UTF-8 bytes, vocabulary 256: no tokenizer files)\n"
    )
    out = run_fwk("train", *args, "data.tokenizer=bytes", runs=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr  # the fix it names works


def test_the_hf_export_carries_the_tokenizer_the_run_trained_with(tmp_path: Path) -> None:
    tok = tokenizer_folder(tmp_path / "tok", TEXTS)
    args = ["recipe=hf_llama_stdlib", "model.config.vocab_size=300", "model.config.hidden_size=32", "data=hf"]
    args += [f"data.path={_jsonl(tmp_path / 't.jsonl')}", f"data.tokenizer={tok}", "data.seq_len=16"]
    args += ["data.val_every=3", "train.max_steps=2", "train.eval_every=2", "train.batch_size=4", "jit=off"]
    runs = tmp_path / "runs"
    out = run_fwk("train", *args, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    out = run_fwk("export", "--format", "hf", "--output", str(tmp_path / "out"), runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tokenizer.json" in out.stdout and (tmp_path / "out" / "tokenizer.json").is_file()
    assert (tmp_path / "out" / "tokenizer.json").read_text() == (tok / "tokenizer.json").read_text()
