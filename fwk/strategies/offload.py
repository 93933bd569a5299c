"""memory=offload: saved activations kept off the training device between forward and
backward, and brought back one ahead of backward's need.

Forward hands each activation autograd saves to ``pack``. A large dense one is copied away
and its device memory freed. Backward asks for them back in about the reverse order, so
each ``unpack`` starts bringing back the ``ahead`` activations saved before it while the
current one is used (the newest not yet asked for: backward takes one node's tensors in
forward's order). Where they go depends on the device:

- CUDA: pinned host memory. The copies out and back run on a side stream, ordered against
  the compute stream by events, so they overlap the kernels.
- CPU: the training device is host memory already, so the next tier is a spill file
  (``memory.offload_dir``, the system's temporary folder by default). A writer thread
  writes each activation and a reader thread reads the next ones back; file I/O and
  copies release the GIL, so both overlap the step's compute. Forward waits when more than
  ``ahead`` activations await their write, so what offload holds in memory stays bounded
  (``resident_peak``, which memory=auto weighs against its budget) however fast the disk is.

The bytes come back unchanged, so gradients equal those of memory=none exactly. Small
tensors (under ``min_bytes``), the model's own parameters and buffers, and layouts that
are not dense (views with gaps) stay where they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import sys
import tempfile
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from fwk.errors import UserError

MIN_BYTES = 1 << 16  # smaller tensors cost more to move than they free
_LIBC = ctypes.CDLL(ctypes.util.find_library("c")) if sys.platform.startswith("linux") else None


def _give_back() -> None:
    """Return the heap's free pages to the system. glibc keeps a freed tensor's memory for the
    process's next allocation, so without this an offloaded activation frees nothing the system sees."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


@dataclass
class _Saved:
    """One offloaded activation: where its bytes are and how to rebuild it."""

    index: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    nbytes: int
    offset: int = 0  # CPU: where in the spill file
    host: torch.Tensor | None = None  # CUDA: the pinned copy
    written: Any = None  # CPU: the write's Future; CUDA: the copy-out event
    back: Any = None  # the prefetch: CPU a Future of the tensor; CUDA (tensor, event)
    kept: torch.Tensor | None = None  # CPU: the tensor until it is written
    asked: bool = False  # backward has asked for it


def _dense(t: torch.Tensor) -> bool:
    """Tell whether ``t`` covers its memory without gaps or overlaps, in some dimension order."""
    if t.is_contiguous():
        return True
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """Return ``t``'s memory span as a flat uint8 tensor (``t`` is dense)."""
    span = t.detach().as_strided((t.numel(),), (1,), t.storage_offset())  # dense: numel elements from the offset
    return span.view(torch.uint8)


class Offload:
    """Saved-tensor hooks of one micro-batch's forward and backward. A fresh one per piece."""

    def __init__(
        self, device: torch.device, ignore: set[int], ahead: int = 1, spill_dir: str = "", min_bytes: int = MIN_BYTES
    ) -> None:
        """Set up one piece's offload. ``ignore`` holds the storages of the model's own tensors."""
        self.device, self.ignore, self.ahead, self.min_bytes = device, ignore, ahead, min_bytes
        self.saved: list[_Saved] = []
        self.hits = 0  # unpacks that found their tensor brought back already
        self.offloaded_bytes = 0
        # CPU: bytes of offloaded activations in memory now, and at most at once: awaiting their
        # write, or read back and not yet handed on
        self.resident = self.resident_peak = 0
        self._pending: deque[Future] = deque()  # CPU: the writes not yet known to be done
        self._handed: _Saved | None = None  # the last one unpacked, in autograd's hands
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._cuda = device.type == "cuda"
        self._dir = self._file = None
        self._end = 0
        self._cursor: int | None = None  # the newest activation not yet brought back ahead
        if self._cuda:
            self._side = torch.cuda.Stream(device)
        else:
            self._dir = tempfile.mkdtemp(prefix="fwk-offload-", dir=spill_dir or None)
            self._file = os.open(os.path.join(self._dir, "activations"), os.O_RDWR | os.O_CREAT, 0o600)
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="fwk-offload-write")
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="fwk-offload-read")

    # ---- the hooks ---------------------------------------------------------------------
    def pack(self, t: torch.Tensor) -> Any:
        if (
            t.device.type != self.device.type
            or t.untyped_storage().nbytes() < self.min_bytes
            or not _dense(t)
            or t.untyped_storage().data_ptr() in self.ignore
        ):
            return t
        nbytes = t.numel() * t.element_size()
        s = _Saved(len(self.saved), tuple(t.shape), tuple(t.stride()), t.dtype, t.device, nbytes)
        self.saved.append(s)
        self.offloaded_bytes += nbytes
        (self._out_cuda if self._cuda else self._out_cpu)(s, t)
        return s

    def unpack(self, s: Any) -> torch.Tensor:
        if not isinstance(s, _Saved):
            return s
        with self._lock:
            self.hits += s.back is not None
            if s.back is None:
                self._bring(s)
            s.asked = True
            # backward walks forward's order backwards, one node's tensors at a time: keep
            # ``ahead`` of them on the way from the newest not yet asked for
            if self._cursor is None:
                self._cursor = len(self.saved) - 1
            brought = 0
            while brought < self.ahead and self._cursor >= 0:
                nxt = self.saved[self._cursor]
                self._cursor -= 1
                if nxt.back is None and not nxt.asked:
                    self._bring(nxt)
                    brought += 1
        t = self._wait(s)
        s.back = None  # autograd holds it now; unpacked again (retain_graph), it comes back again
        if not self._cuda:  # the one unpacked before is used by now: backward has moved on
            with self._lock:
                if self._handed is not None:
                    self._count(-self._handed.nbytes)
                self._handed = s
        return t

    def _count(self, nbytes: int) -> None:
        with self._count_lock:
            self.resident += nbytes
            self.resident_peak = max(self.resident_peak, self.resident)

    # ---- CPU: a spill file, a writer and a reader thread ----------------------------------
    def _out_cpu(self, s: _Saved, t: torch.Tensor) -> None:
        s.offset, self._end = self._end, self._end + s.nbytes
        s.kept = t  # alive until written; then its memory is freed
        self._count(s.nbytes)
        s.written = self._writer.submit(self._write, s)
        self._pending.append(s.written)
        while len(self._pending) > self.ahead:  # at most ``ahead`` awaiting their write
            self._pending.popleft().exception()  # waits; a failed write surfaces where it is read

    def _write(self, s: _Saved) -> None:
        assert s.kept is not None
        data = _bytes(s.kept).numpy()
        done = 0
        while done < s.nbytes:
            done += os.pwrite(self._file, data[done:], s.offset + done)
        s.kept = None
        self._count(-s.nbytes)
        _give_back()

    def _read(self, s: _Saved) -> torch.Tensor:
        failed = s.written.exception()
        if isinstance(failed, OSError):
            raise UserError(
                f"memory=offload could not write saved activations to {self._dir}: {failed.strerror or failed}; "
                "free space there, point memory.offload_dir at a folder with room, or use memory=checkpoint"
            ) from failed
        if failed is not None:
            raise failed
        t = torch.empty_strided(s.size, s.stride, dtype=s.dtype)
        view = _bytes(t).numpy()
        done = 0
        while done < s.nbytes:
            done += os.preadv(self._file, [view[done:]], s.offset + done)
        return t

    # ---- CUDA: pinned host memory, a side stream -------------------------------------------
    def _out_cuda(self, s: _Saved, t: torch.Tensor) -> None:
        s.host = torch.empty_strided(s.size, s.stride, dtype=s.dtype, pin_memory=True)
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._side):
            s.host.copy_(t, non_blocking=True)
            t.record_stream(self._side)  # its memory is not reused before the copy ends
            s.written = torch.cuda.Event()
            s.written.record(self._side)

    def _bring(self, s: _Saved) -> None:
        """Start bringing ``s`` back to the device."""
        if not self._cuda:
            self._count(s.nbytes)
            s.back = self._reader.submit(self._read, s)
            return
        assert s.host is not None
        with torch.cuda.stream(self._side):
            self._side.wait_event(s.written)
            t = torch.empty_strided(s.size, s.stride, dtype=s.dtype, device=s.device)
            t.copy_(s.host, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._side)
        s.back = (t, ready)

    def _wait(self, s: _Saved) -> torch.Tensor:
        if not self._cuda:
            return s.back.result()
        t, ready = s.back
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(ready)
        t.record_stream(compute)  # allocated on the side stream, used on this one
        return t

    # ---- the piece's end -------------------------------------------------------------------
    def close(self) -> None:
        """Wait for what is in flight and free the spill file."""
        if self._cuda:
            self._side.synchronize()
            return
        futures: list[Future] = [s.written for s in self.saved if s.written is not None]
        futures += [s.back for s in self.saved if isinstance(s.back, Future)]
        for f in futures:
            f.exception()  # waits; a failed write surfaces where its tensor is read
        self._writer.shutdown()
        self._reader.shutdown()
        os.close(self._file)
        shutil.rmtree(self._dir, ignore_errors=True)
