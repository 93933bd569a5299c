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

        if stream is sys.stdout:
            return get_console()
        key = id(stream)
        if key not in self._consoles:
            self._consoles[key] = Console(file=stream)
        return self._consoles[key]


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
