"""fwk's one logger (fwk/log.py): lines shown by one handler, rank 0's only, on the stream a
command asks for; records reach a library user's own handlers (and caplog) too."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest
from rich.console import Console

from fwk.log import ROOT, Lines, collected, show


@pytest.fixture
def restored() -> Iterator[logging.Logger]:
    """fwk's logger as the test found it: show() installs a handler and a level."""
    logger = logging.getLogger(ROOT)
    handlers, level = list(logger.handlers), logger.level
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_rank_0_shows_its_lines_on_stdout(restored: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    show()
    logging.getLogger("fwk.strategies.jit").info("jit=auto keeps compiled: 2.00x")
    logging.getLogger("fwk.track.lease").warning("warning: the lease was taken over")
    logging.getLogger("other.library").warning("not fwk's")  # another library's logger: not ours to show
    out = capsys.readouterr()
    assert out.out == "jit=auto keeps compiled: 2.00x\nwarning: the lease was taken over\n"
    assert "jit=auto" not in out.err


def test_other_ranks_show_only_warnings(restored: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    show(rank=1)
    log = logging.getLogger("fwk.engine.trainer")
    log.info("resumed run abc from step-00000040 (step 40)")
    log.warning("rank 1: non-finite loss at step 7")
    assert capsys.readouterr().out == "rank 1: non-finite loss at step 7\n"


def test_a_command_whose_stdout_is_its_result_moves_the_lines_to_stderr(
    restored: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    show()
    show("stderr")  # fwk runs, fwk replay --json: a second show replaces the first
    assert sum(isinstance(h, Lines) for h in restored.handlers) == 1
    logging.getLogger("fwk.track.index").warning("fwk: run index was corrupt; rebuilt it from 2 run dirs")
    out = capsys.readouterr()
    assert out.out == "" and out.err == "fwk: run index was corrupt; rebuilt it from 2 run dirs\n"


def test_lines_still_reach_the_users_own_handlers(restored: logging.Logger, said: pytest.LogCaptureFixture) -> None:
    show()
    logging.getLogger("fwk.strategies.memory").info("memory=none")
    assert said.messages == ["memory=none"]


def test_nothing_is_shown_before_show(restored: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    """A library user who configured no logging sees no info lines (Python's default)."""
    restored.handlers[:] = [h for h in restored.handlers if not isinstance(h, Lines)]
    restored.setLevel(logging.NOTSET)
    logging.getLogger("fwk.strategies.kernels").info("kernels: plain PyTorch")
    assert capsys.readouterr().out == ""


def test_collected_reads_back_the_lines_of_a_block(restored: logging.Logger) -> None:
    level, handlers = restored.level, list(restored.handlers)
    log = logging.getLogger("fwk.strategies.jit")
    log.info("before the block")
    with collected() as lines:
        log.info("jit=auto stays eager")
        log.debug("not a report line")
    log.info("after it")
    assert lines == ["jit=auto stays eager"]
    assert (restored.level, restored.handlers) == (level, handlers)


def test_on_a_terminal_lines_go_through_richs_console(
    restored: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console a live progress bar draws on (fwk/components/metrics.py): a line prints
    above the bar, not through it; and a line with brackets is text, not rich markup."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    printed: list[str] = []
    monkeypatch.setattr(Console, "print", lambda self, text, **kw: printed.append((self.file is terminal, text, kw)))
    show()
    logging.getLogger("fwk.methods.base").info("ema [decay 0.999]: evaluates the average")
    assert printed == [(True, "ema [decay 0.999]: evaluates the average", {"markup": False})]
    assert terminal.getvalue() == ""  # not written past the console
