"""TensorBoard event files, written with TensorBoard's own protocol buffers.

torch's ``SummaryWriter`` imports all of ``tensorboard.summary``. That pulls in TensorBoard's
TensorFlow stub, its file system layer and, through it, boto3 and fsspec: about 0.18 s of a
run's start-up, spent to write a few scalars. This writer imports only the two message
modules (``event_pb2``, ``summary_pb2``) and frames each event as a TFRecord itself, which is
the file format TensorBoard reads: a little-endian length, its masked CRC-32C, the event's
bytes and their masked CRC-32C. The events are those ``SummaryWriter`` writes for
``add_scalar``, so TensorBoard's reader sees the same file.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

_CASTAGNOLI = 0x82F63B78  # CRC-32C's polynomial, reflected


def _table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CASTAGNOLI if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _table()
_FILES = itertools.count()  # two writers of one process in the same second get two files


def crc32c(data: bytes) -> int:
    """Return the CRC-32C (Castagnoli) of ``data``, the checksum TFRecord files use."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """Return TFRecord's masked CRC-32C of ``data``: rotated right by 15 bits, plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """Frame ``data`` as one TFRecord."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


class EventWriter:
    """Write scalars to a new event file in ``log_dir``, as ``SummaryWriter.add_scalar`` does.

    ``purge_step`` starts the file with a session start at that step. TensorBoard's reader
    then drops the events at that step and after it that earlier files hold, so a run resumed
    from a checkpoint does not show the steps it logs again twice.
    """

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._event, self._summary = Event, Summary
        log_dir.mkdir(parents=True, exist_ok=True)
        # the name TensorBoard's own writer gives: it sorts by time, then host and process
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILES)}"
        self._file = open(log_dir / name, "xb")  # noqa: SIM115 (kept open until close)
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:
            self._write(Event(step=purge_step, wall_time=time.time(), file_version="brain.Event:2"))
            self._write(Event(step=purge_step, wall_time=time.time(), session_log=SessionLog(status=SessionLog.START)))
        self.flush()

    _FLUSH_S = 30.0  # at most this long between a scalar and the file TensorBoard reads

    def _write(self, event: Any) -> None:
        self._file.write(record(event.SerializeToString()))

    def add_scalars(self, step: int, values: dict[str, float]) -> None:
        """Write one event per scalar at ``step``."""
        now = time.time()
        for tag, value in values.items():
            summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(value))])
            self._write(self._event(wall_time=now, step=step, summary=summary))
        if now - self._flushed > self._FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Put what was written on disk, where a running TensorBoard reads it."""
        self._file.flush()
        self._flushed = time.time()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
