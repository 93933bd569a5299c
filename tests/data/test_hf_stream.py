"""data=hf data.streaming=true: training text read as a stream, shuffled per epoch, split by
rank, packed, and resumed exactly from any batch (the same batches as an uninterrupted
run), on one process and on two; val texts held out by content."""

from __future__ import annotations

import itertools
import json
import zlib
from pathlib import Path

import pytest
import torch

from fwk.data import DATA
from fwk.data.configs import HFDataConfig
from fwk.data.hf_stream import TextStream
from fwk.errors import UserError
from tests.conftest import resumes_bit_exactly
from tests.data.test_hf import tokenizer_folder

# texts of 25-60 bytes, a few with 2-byte characters: windows of 16 cross text boundaries
TEXTS = [f"def f{i}(x):\n    return x * {i}  # {'é' * (i % 3)}{' ' * (i % 17)}\n" for i in range(240)]


def _jsonl(path: Path, texts: list[str] = TEXTS) -> Path:
    path.write_text("".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(texts)))
    return path


def _stream(path: Path, **kw: object) -> object:
    kw = {"tokenizer": "bytes", "seq_len": 16, "val_every": 10, "streaming": True} | kw
    cfg = HFDataConfig(path=str(path), **kw)  # type: ignore[arg-type]
    return DATA.get("hf").builder(cfg, seed=3)


def _loader(data: object, world: int = 1, rank: int = 0, rows: int = 4) -> TextStream:
    return data.train_loader(rows, world, {}, None, rank)  # type: ignore[attr-defined]


def _one_lane(loader: TextStream, batches: int) -> bytes:
    """The bytes of ``batches`` windows of a one-row loader of one open text at a time: the
    texts it reads, contiguous."""
    return b"".join(bytes(x.flatten().tolist()) for x, _ in itertools.islice(loader, batches))


def _same(a: list, b: list) -> bool:
    pairs = zip(a, b, strict=True) if len(a) == len(b) else [((torch.zeros(1),), (torch.ones(1),))]
    return all(torch.equal(x, y) for p, q in pairs for x, y in zip(p, q, strict=True))


def _is_val(text: str) -> bool:
    return zlib.crc32(text.encode()) % 10 == 0


@pytest.mark.parametrize("open_texts", [8, 1024])  # fewer than the texts; more (all are open at once)
def test_a_stream_resumes_exactly_from_any_batch_into_later_epochs(tmp_path: Path, open_texts: int) -> None:
    data = _stream(_jsonl(tmp_path / "t.jsonl"), shuffle_buffer=50, open_texts=open_texts)
    loader, straight, epochs = _loader(data), [], []
    for batch in itertools.islice(loader, 420):  # ~170 batches an epoch: into the third
        straight.append(batch)
        epochs.append(loader.state_dict()["epoch"])  # of the position after the batch
    second = epochs.index(1)  # the batch after it is the second epoch's first
    assert epochs[-1] >= 2 and not torch.equal(straight[0][0], straight[second + 1][0])  # shuffled anew
    for k in (1, 37, second, second + 1, 300):
        first = _loader(data)
        got = list(itertools.islice(first, k))
        state = first.state_dict()
        again = _loader(data)
        again.load_state_dict(json.loads(json.dumps(state)))  # plain ints: it goes through torch.save as is
        got += list(itertools.islice(again, 420 - k))
        assert _same(got, straight), (k, state)
    assert state["epoch"] >= 1 and state["world_size"] == 1


def test_each_row_of_a_batch_is_the_next_window_of_an_open_text(tmp_path: Path) -> None:
    data = _stream(_jsonl(tmp_path / "t.jsonl"), shuffle_buffer=0, open_texts=4)  # as many as rows: all drawn
    train = [t.encode() + b"\n" for t in TEXTS if not _is_val(t)]
    (x0, y0), (x1, _) = itertools.islice(_loader(data), 2)
    for j in range(4):  # texts of 26-60 bytes: the rows are the first 4 texts' starts, taken in file order
        assert bytes(x0[j].tolist()) == train[j][:16] and bytes(y0[j].tolist()) == train[j][1:17]
    assert sorted(x1[:, 0].tolist()) == sorted(y0[:, -1].tolist())  # each text goes on where it stopped
    assert x0.shape == (4, 16) and x0.dtype == torch.int64
    rows = [bytes(x[0].tolist()) for x, _ in itertools.islice(_loader(data, rows=1), 3)]  # one row: 4 texts drawn
    rows += [bytes(x[0].tolist()) for x, _ in itertools.islice(_loader(data, rows=1), 3)]
    assert rows[:3] == rows[3:] and len({r[:4] for r in rows[:3]}) > 1  # the same draws each time


def test_val_texts_are_held_out_by_content_on_every_rank(tmp_path: Path) -> None:
    data = _stream(_jsonl(tmp_path / "t.jsonl"), shuffle_buffer=50, open_texts=1)
    val = [t for t in TEXTS if _is_val(t)]
    assert 10 <= len(val) <= 40
    assert torch.equal(data.val.data, torch.tensor(list(b"".join(t.encode() + b"\n" for t in val)), dtype=torch.int32))
    seen = _one_lane(_loader(data, rows=1), 600)  # one open text at a time: ~10,000 bytes, most of an epoch
    assert not any(t.encode() in seen for t in val)
    assert sum(t.encode() in seen for t in TEXTS if not _is_val(t)) > 150


def test_two_ranks_read_disjoint_texts(tmp_path: Path) -> None:
    data = _stream(_jsonl(tmp_path / "t.jsonl"), shuffle_buffer=50, seq_len=64, open_texts=1)
    # 60 windows of 64 bytes: most of a rank's ~4,800 bytes an epoch (the next epoch deals anew)
    seen = [_one_lane(_loader(data, 2, r, rows=1), 60) for r in (0, 1)]
    texts = [[t for t in TEXTS if t.encode() in s] for s in seen]
    assert min(map(len, texts)) > 60 and not set(texts[0]) & set(texts[1])


def test_a_saved_folder_streams_with_its_validation_split_and_a_tokenizer(tmp_path: Path) -> None:
    import datasets
    from transformers import AutoTokenizer

    splits = {"train": TEXTS[:200], "validation": TEXTS[200:]}
    datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v}) for k, v in splits.items()}).save_to_disk(
        tmp_path / "saved"
    )
    folder = tokenizer_folder(tmp_path / "tok", TEXTS)
    data = _stream(tmp_path / "saved", tokenizer=str(folder), shuffle_buffer=0, seq_len=8, open_texts=1)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = lambda texts: [i for t in texts for i in tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]  # noqa: E731
    assert data.val.data.tolist() == ids(TEXTS[200:]) and data.num_classes == len(tok)
    lane = [x.flatten().tolist() for x, _ in itertools.islice(_loader(data, rows=1), 4)]
    assert sum(lane, []) == ids(TEXTS[:200])[:32]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"label_column": "n"}, "data.streaming=true streams text for language modelling; with data.label_column=n"),
        ({"text_column": "body"}, "data.text_column=body: the data has no such column; its columns: text, n"),
        ({"shuffle_buffer": -1}, "data.shuffle_buffer=-1 must be >= 0"),
    ],
)
def test_what_cannot_work_is_one_line(tmp_path: Path, kw: dict, message: str) -> None:
    with pytest.raises(UserError, match="^" + message.replace(".", r"\.")):
        _stream(_jsonl(tmp_path / "t.jsonl"), **kw)


def test_workers_asked_for_apply_to_validation_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = _stream(_jsonl(tmp_path / "t.jsonl"))
    with caplog.at_level("INFO", logger="fwk.data.hf_stream"):
        loader = data.train_loader(4, 1, {"num_workers": 2, "pin_memory": False}, None, 0)  # type: ignore[attr-defined]
    assert "loader.num_workers=2 applies to validation only" in caplog.text
    assert next(iter(loader))[0].shape == (4, 16)


def test_too_little_text_for_a_batch_is_one_line(tmp_path: Path) -> None:
    data = _stream(_jsonl(tmp_path / "t.jsonl", TEXTS[:30]))
    with pytest.raises(UserError, match=r"^data\.path=.*: an epoch of this rank's texts makes too few tokens for one"):
        next(iter(data.train_loader(400, 1, {}, None, 0)))  # type: ignore[attr-defined]


ARGS = ["recipe=hf_llama_stdlib", "data=hf", "data.streaming=true", "data.seq_len=32", "data.val_every=4"]
ARGS += ["model.config.hidden_size=32", "model.config.intermediate_size=64", "model.config.num_attention_heads=2"]
ARGS += ["model.config.num_key_value_heads=2", "train.batch_size=4", "train.eval_every=8", "train.log_every=4"]
ARGS += ["checkpoint.every=4", "checkpoint.keep=10", "jit=off", "precision=fp32"]


def test_the_llama_recipe_on_streamed_text_resumes_bit_exactly(tmp_path: Path) -> None:
    texts = _jsonl(tmp_path / "t.jsonl", [t * 4 for t in TEXTS[:60]])  # default shuffle buffer: all of them
    straight, run, _ = resumes_bit_exactly(["train", *ARGS, f"data.path={texts}", "train.max_steps=16"], tmp_path, 16)
    assert "data=hf: streaming the training texts of data.path=" in straight.stdout


def test_two_processes_resume_each_from_its_own_position(tmp_path: Path) -> None:
    texts = _jsonl(tmp_path / "t.jsonl", [t * 4 for t in TEXTS[:60]])
    args = ["train", *ARGS, f"data.path={texts}", "train.max_steps=12", "parallel=ddp", "parallel.nproc_per_node=2"]
    _, run, _ = resumes_bit_exactly(args, tmp_path, 12)
    ranks = [torch.load(p, weights_only=True)["loader"] for p in sorted((run / "checkpoints").glob("*4/rng-rank*.pt"))]
    assert len(ranks) == 2 and ranks[0]["lanes"] != ranks[1]["lanes"]


def test_a_run_of_two_processes_resumes_on_one_at_the_next_epoch(tmp_path: Path) -> None:
    """A lost node (elastic): the run goes on with fewer processes instead of stopping."""
    from tests.conftest import interrupt_after, run_fwk

    texts = _jsonl(tmp_path / "t.jsonl", [t * 4 for t in TEXTS[:60]])
    args = ["train", *ARGS, f"data.path={texts}", "train.max_steps=12", "parallel=ddp", "parallel.nproc_per_node=2"]
    stopped = interrupt_after(args, tmp_path / "runs", "*/checkpoints/step-*/manifest.json")
    assert stopped.returncode in (0, 130), stopped.stdout + stopped.stderr
    one = [a for a in args if not a.startswith("parallel.nproc_per_node")] + ["parallel.nproc_per_node=1"]
    resumed = run_fwk(*one, runs=tmp_path / "runs", timeout=600)
    assert resumed.returncode == 0 and "resumed run" in resumed.stdout, resumed.stdout + resumed.stderr
    assert "the checkpoint was taken with 2 processes, this run has 1; resuming at the start of epoch 1" in (
        resumed.stdout
    )
    (run,) = (tmp_path / "runs").glob("*/")
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["final_step"], summary["world_size"], summary["status"]) == (12, 1, "complete")
