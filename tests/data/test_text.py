import pytest
import torch

from fwk.data import text
from fwk.data.text import (
    ByteWindows,
    StdlibTextConfig,
    concat_bytes,
    source_files,
    split_files,
    stdlib_text,
)
from fwk.errors import UserError


def test_file_list_sorted_deterministic_and_filtered():
    root = text.stdlib_root()
    files = source_files(root)
    assert files, "this Python has no stdlib sources"
    rel = [f.relative_to(root).as_posix() for f in files]
    assert rel == sorted(rel)
    assert files == source_files(root)
    for r in rel:
        assert not set(r.split("/")[:-1]) & text.EXCLUDED_DIRS, r
    assert "os.py" in rel


def test_split_disjoint_by_file():
    files = source_files(text.stdlib_root())
    train, val = split_files(files, 20)
    assert not set(train) & set(val)
    assert len(train) + len(val) == len(files)
    assert val == files[19::20]


def test_items_and_caps():
    b = stdlib_text(StdlibTextConfig(seq_len=32, max_bytes=4096, val_max_bytes=1024), seed=0)
    assert (b.task, b.num_classes) == ("lm", 256)
    assert len(b.train.data) == 4096 and len(b.val.data) == 1024
    assert len(b.train) == (4096 - 1) // 32
    x, y = b.train[3]
    assert x.shape == y.shape == (32,)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x, b.train.data[96:128].long())
    assert torch.equal(y[:-1], x[1:])  # y is x shifted by one
    assert y[-1] == b.train.data[128]
    last_x, last_y = b.train[len(b.train) - 1]
    assert last_x.shape == last_y.shape == (32,)
    with pytest.raises(IndexError):
        b.train[len(b.train)]


def test_concat_is_files_joined_by_newline(tmp_path):
    (tmp_path / "a.py").write_bytes(b"ab")
    (tmp_path / "b.py").write_bytes(b"cd")
    files = source_files(tmp_path)
    assert concat_bytes(files).tolist() == list(b"ab\ncd")
    assert concat_bytes(files, max_bytes=4).tolist() == list(b"ab\nc")


def test_windows_of_tiny_data():
    ds = ByteWindows(torch.arange(10, dtype=torch.uint8), seq_len=3)
    assert len(ds) == 3  # 9 bytes of input need a 10th for the last target
    assert [t.tolist() for t in ds[2]] == [[6, 7, 8], [7, 8, 9]]


def test_no_sources_is_user_error(tmp_path, monkeypatch):
    monkeypatch.setattr(text, "stdlib_root", lambda: tmp_path)
    with pytest.raises(UserError, match="no .py files"):
        stdlib_text(StdlibTextConfig(), seed=0)
