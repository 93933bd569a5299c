"""fwk's TensorBoard event writer against TensorBoard's own: the checksum, the framing, and the
scalars TensorBoard's reader sees, with and without a purge."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from fwk.components.events import EventWriter, crc32c, masked_crc32c, record
from tests.components.test_sinks import events


def test_crc32c_matches_the_standard_check_value_and_tensorboards_own() -> None:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as theirs

    assert crc32c(b"123456789") == 0xE3069283  # CRC-32C's check value
    rng = random.Random(0)
    for size in (0, 1, 7, 8, 100, 1000):
        data = bytes(rng.randrange(256) for _ in range(size))
        assert masked_crc32c(data) == theirs(data)


def test_record_is_the_framing_of_tensorboards_record_writer() -> None:
    from tensorboard.summary.writer.record_writer import RecordWriter

    class Sink:
        def __init__(self) -> None:
            self.out = b""

        def write(self, data: bytes) -> None:
            self.out += data

    sink = Sink()
    RecordWriter(sink).write(b"an event's bytes")
    assert record(b"an event's bytes") == sink.out


def test_scalars_read_back_as_torchs_summary_writer_writes_them(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    values = [(step, {"train/loss": 1.0 / step, "train/lr": 0.1 * step}) for step in (1, 5, 10)]
    ours = EventWriter(tmp_path / "ours", purge_step=0)
    theirs = SummaryWriter(str(tmp_path / "theirs"), purge_step=0)
    for step, row in values:
        ours.add_scalars(step, row)
        for tag, value in row.items():
            theirs.add_scalar(tag, value, step)
    ours.close()
    theirs.close()
    assert events(tmp_path / "ours") == events(tmp_path / "theirs")
    assert [s for s, _ in events(tmp_path / "ours")["train/loss"]] == [1, 5, 10]


def test_a_resumed_writer_purges_the_steps_logged_again(tmp_path: Path) -> None:
    first = EventWriter(tmp_path, purge_step=0)
    for step in range(1, 11):
        first.add_scalars(step, {"loss": float(step)})
    first.close()  # the run stopped at step 10; its checkpoint was at step 6
    resumed = EventWriter(tmp_path, purge_step=7)
    for step in range(7, 9):
        resumed.add_scalars(step, {"loss": 100.0 + step})
    resumed.close()
    assert events(tmp_path)["loss"] == [*((s, float(s)) for s in range(1, 7)), (7, 107.0), (8, 108.0)]


def test_two_writers_in_one_second_write_two_files(tmp_path: Path) -> None:
    EventWriter(tmp_path).close()
    EventWriter(tmp_path).close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2


def test_the_writer_does_not_import_tensorboards_summary_package() -> None:
    code = (
        "import sys, pathlib, tempfile\n"
        "from fwk.components.events import EventWriter\n"
        "EventWriter(pathlib.Path(tempfile.mkdtemp())).add_scalars(1, {'a': 1.0})\n"
        "print(sorted(m for m in sys.modules if m.startswith(('tensorboard.summary', 'boto', 'torch'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
