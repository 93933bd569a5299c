"""fwk's report lines: one logger tree, ``fwk.*``, and the one handler that shows it.

Every module logs through ``logging.getLogger(__name__)``. Nothing is shown until an entry
point, the CLI or a worker, calls ``show()``. Then rank 0's lines print one per line on one
stream: stdout, or stderr for a command whose stdout holds its result. They print plainly on a
pipe, and through rich's console on a terminal, where they print above a live progress bar.
Other ranks show only warnings, into their own log file under torchrun. Records still
propagate, so a library user's own logging config, or pytest's ``caplog``, gets them too.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

ROOT = "fwk"


class Lines(logging.Handler):
    """A handler that prints each record's message as one line on ``stream``, ``"stdout"`` or ``"stderr"``.

    The stream is looked up when it prints, so that captured or redirected streams are followed.
    Records below warning print only on rank 0.
    """

    def __init__(self, stream: str = "stdout", rank: int = 0) -> None:
        super().__init__(logging.INFO)
        self.stream, self.rank = stream, rank
        self._consoles: dict[int, Any] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        return self.rank == 0 or record.levelno >= logging.WARNING

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            stream: IO[str] = sys.stderr if self.stream == "stderr" else sys.stdout
            # under a live progress bar, rich wraps the streams in a proxy; the console is keyed
            # by the stream beneath, the bar's own (``terminal``), which prints each line above it
            stream = getattr(stream, "rich_proxied_file", stream)
            if stream.isatty():
                self._console(stream).print(text, markup=False)
            else:
                stream.write(text + "\n")
                stream.flush()
        except Exception:  # a closed stream: logging's own report, never the caller's error
            self.handleError(record)

    def _console(self, stream: IO[str]) -> Any:
        """Return rich's console for this terminal. For stdout it is the shared one, the progress bar's."""
        from rich import get_console
        from rich.console import Console

        if stream is getattr(sys.stdout, "rich_proxied_file", sys.stdout):
            return get_console()
        key = id(stream)
        if key not in self._consoles:
            self._consoles[key] = Console(file=stream)
        return self._consoles[key]


def terminal() -> Any | None:
    """Return rich's console that fwk's report lines print through, where they go to a terminal,
    else None. A live progress bar draws there (fwk/components/metrics.py), so each line prints
    above it, and a command whose lines go to stderr keeps the bar off its stdout."""
    handler = next((h for h in logging.getLogger(ROOT).handlers if isinstance(h, Lines)), None)
    stream = sys.stderr if handler is not None and handler.stream == "stderr" else sys.stdout
    stream = getattr(stream, "rich_proxied_file", stream)
    if not stream.isatty():
        return None
    if handler is None:
        from rich import get_console

        return get_console()
    return handler._console(stream)


def show(stream: str = "stdout", rank: int = 0) -> Lines:
    """Show fwk's report lines from here on, replacing what an earlier ``show`` installed."""
    logger = logging.getLogger(ROOT)
    for old in [h for h in logger.handlers if isinstance(h, Lines)]:
        logger.removeHandler(old)
    handler = Lines(stream, rank)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def collected() -> Iterator[list[str]]:
    """Collect fwk's report lines said inside the block, in order. A benchmark reads them back
    to learn what an auto strategy chose and why."""
    logger, lines = logging.getLogger(ROOT), []
    handler, level = _Collect(lines), logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level or logging.INFO, logging.INFO))
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextmanager
def stdout_on_stderr() -> Iterator[None]:
    """Send everything written to stdout inside the block to stderr, for a command whose stdout
    holds its result alone (``fwk replay --json``).

    It is done on the file descriptor, so that it also holds for what the run inside prints
    through C or rich, its progress bar (drawn where stdout is a terminal), and torchrun's
    workers, whose rank 0 inherits the descriptor and shows its report lines there."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all: nothing to keep clean
        yield
        return
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
