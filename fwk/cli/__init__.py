"""The `fwk` command line. Nothing here imports torch: `fwk --help` must start fast."""

from __future__ import annotations

import atexit
import logging
import os
import sys

import typer

from fwk.cli.data import data
from fwk.cli.doctor import doctor
from fwk.cli.export import export
from fwk.cli.profile import profile
from fwk.cli.replay import replay
from fwk.cli.runs import runs
from fwk.cli.serve import serve
from fwk.cli.train import train
from fwk.errors import UserError
from fwk.log import show
from fwk.track import startup

app = typer.Typer(
    name="fwk",
    help="Train PyTorch models from composable recipes: fwk train recipe=NAME key=value ...",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(
    context_settings={"allow_extra_args": False, "ignore_unknown_options": True},
)(train)


app.command()(doctor)
app.command(context_settings={"ignore_unknown_options": True})(export)
app.command(context_settings={"ignore_unknown_options": True})(profile)
app.command()(replay)
app.command(context_settings={"ignore_unknown_options": True})(serve)
app.add_typer(data, name="data")
app.add_typer(runs, name="runs")


@app.callback()
def _root() -> None:
    """fwk: a training launcher for PyTorch."""


def main() -> None:
    """Run the console entry point. A user's mistake is one line on stderr and exit 2, not a
    traceback."""
    # Hydra logs each `_target_` it fails to look up at ERROR, then raises, and fwk reports the
    # raised error. The build looks a target up twice, so the line would come three times.
    logging.getLogger("hydra.utils").setLevel(logging.CRITICAL)
    show()  # fwk's report lines on stdout (a command that prints results there moves them)
    startup.mark("python")
    try:
        app()
    except UserError as exc:
        # one line, whatever the message quotes (an ImportError's text spans three)
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"fwk: error: {text}", file=sys.stderr)
        leave(exc.exit_code)
    except SystemExit as exc:
        leave(exc.code)


def leave(code: int | str | None) -> None:
    """Exit with ``code``, skipping the interpreter's teardown when the command imported torch.

    Freeing torch's modules and unloading its libraries takes ~0.4 s after the run is on disk, and ~1 s once
    TorchDynamo is in. Every optimizer imports TorchDynamo. Without the skip, ``fwk train`` would return to the
    shell a second late. The atexit handlers, such as logging's and multiprocessing's for its children, still run,
    and the run's files are closed by then. A worker (fwk/launch/worker.py) ends with os._exit too.
    """
    if "torch" not in sys.modules:
        sys.exit(code)
    if isinstance(code, str):  # sys.exit("message"): the message on stderr, status 1
        print(code, file=sys.stderr)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else int(code is not None))
