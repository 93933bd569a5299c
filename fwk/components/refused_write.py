"""A save that the file system refused: a full disk, a quota, a file-size limit.

``torch.save`` says only "unexpected pos" or "file write failed" (its zip writer keeps no errno),
and ``dcp.save`` wraps each rank's error in a ``CheckpointException``, a ``BaseException``. So
the cause is asked of the file system itself: beside the partial files, before they are
removed, a small write is tried, and its errno says what the save met (ENOSPC, EDQUOT, EFBIG).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
PROBE = 1 << 20  # bytes: more than is left of a file-size limit or a disk that refused a write just now
_TORCH_WRITER = ("inline_container", "PytorchStreamWriter", "file write failed")  # torch.save's own errors


def _is_write_failure(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in FULL
    return isinstance(exc, RuntimeError) and any(word in str(exc) for word in _TORCH_WRITER)


def _probe(folder: Path) -> int | None:
    """Try a write of PROBE bytes in ``folder``; return its errno when the file system refuses it."""
    path = folder / f".fwk-probe-{os.getpid()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            left = memoryview(b"\0" * PROBE)
            while left:  # a write that meets a limit writes what fits and returns; the next one fails
                left = left[os.write(fd, left) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.errno
    finally:
        path.unlink(missing_ok=True)
    return None


def cause(exc: BaseException, folder: Path) -> int | None:
    """Return the errno of what refused the save that raised ``exc`` in ``folder``: 0 when the
    file system refused a write but accepts one now; None when ``exc`` is not a refused write."""
    from fwk.components.dcp_reader import within  # torch.distributed.checkpoint: only once a save failed

    found = within(exc, _is_write_failure)
    if found is None:
        return None
    if isinstance(found, OSError) and found.errno in FULL:
        return found.errno
    code = _probe(folder) if folder.is_dir() else None
    return code if code in FULL else 0
