"""`fwk` commands forked from a process that has imported torch and fwk once.

A test that runs the real `fwk` command pays ~4 s of CPU before the command does anything:
the interpreter, torch (~2.7 s) and fwk's own modules. The suite runs ~250 such commands,
so on 2 cores that was a third of `make test`. Here each pytest worker starts one server
process that imports them once (``PRELOAD``) and then forks a child per command. The child
takes the command's argv, environment, working directory and standard streams, and runs
``python -m fwk``'s code from there: ``fwk.cli.main``, its exit status, its signals (the
test gets the child's pid: Ctrl-C and SIGKILL reach the command itself), and the processes
it starts: torchrun's agent and workers as forks of the command (tests/forked_ranks.py), any
other command as before.

What a fork does not show is what a fresh interpreter would import, and what reads the
environment at import time. So:

- the preloaded modules are those a `fwk` command imports anyway, none of them reads a
  variable a test sets (litdata, MLflow and boto are not preloaded: each reads its own
  variables on import);
- the paths that must not import torch are tested in fresh processes
  (tests/cli/test_help.py, test_fast_paths.py, test_runs.py), as are the launcher's own
  signal and process-group tests (tests/launch/test_supervise.py);
- ``FWK_TEST_FORK=0`` runs every command in a fresh interpreter instead.

The server is single-threaded (forking a process with other threads can copy a held lock),
and is started with ``OMP_NUM_THREADS`` set (tests/conftest.py) so that importing numpy and
torch starts no thread pool.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

# What every `fwk train` imports: torch, TorchDynamo (every optimizer's first step imports it),
# TensorBoard's event messages (the default sink), Hydra and fwk's own modules.
PRELOAD = (
    "torch",
    "torch._dynamo",
    "tensorboard.compat.proto.event_pb2",
    "hydra",
    "fwk.cli",
    "fwk.launch.worker",
    "fwk.engine.trainer",
)
ENABLED = os.environ.get("FWK_TEST_FORK", "1") != "0"
MAX_REQUEST = 1 << 20  # bytes of one request: its argv and environment


def become(
    module: str,
    args: list[str],
    env: dict[str, str],
    cwd: str | None,
    fds: list[int],
    new_session: bool,
    close_fds: bool = False,
    pass_fds: tuple[int, ...] = (),
    preexec_fn: Any = None,
) -> None:
    """In a forked child: become ``python -m MODULE ARGS`` and never return.

    ``fds`` become the child's stdin, stdout and stderr (-1: keep the one it has); with
    ``close_fds`` every other descriptor but ``pass_fds`` is closed, and ``preexec_fn`` is
    called after the new session is made, as ``subprocess.Popen`` does. Signals
    are as a fresh interpreter has them: those with a handler back to the default, those
    ignored still ignored (as exec(2) leaves them), SIGINT raising KeyboardInterrupt."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            if fd != -1 and fd != target:
                os.dup2(fd, target)
        for fd in set(fds) - {-1, 0, 1, 2}:
            os.close(fd)
        if close_fds:
            # the parent's file objects stay open in memory: none may be collected and close a
            # descriptor number that this process has since opened anew
            gc.freeze()
            bounds = [2, *sorted(fd for fd in pass_fds if fd > 2), os.sysconf("SC_OPEN_MAX")]
            for low, high in itertools.pairwise(bounds):
                os.closerange(low + 1, high)
        if new_session:
            os.setsid()
        if preexec_fn is not None:
            preexec_fn()
        if cwd:
            os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        for sig in signal.valid_signals():
            handler = signal.getsignal(sig)
            if callable(handler) and sig != signal.SIGINT:
                signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if "OMP_NUM_THREADS" in env:
            import torch

            torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
        import importlib.util
        import runpy

        # runpy warns that the module it runs as __main__ was imported already: it was preloaded
        warnings.filterwarnings("ignore", "'.*' found in sys.modules after import of package", RuntimeWarning)
        spec = importlib.util.find_spec(module)
        main = spec.submodule_search_locations and Path(spec.origin).parent / "__main__.py"
        sys.argv = [str(main or spec.origin), *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0  # fwk.cli.main ends in sys.exit / os._exit: this is a return without either
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        # as the interpreter does with an uncaught Ctrl-C: die of SIGINT
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(path: str) -> None:
    """The server: import ``PRELOAD``, then fork a child per request on the socket at ``path``.

    A request is one message: a JSON object and three file descriptors (stdin, stdout,
    stderr). The answers are two messages: the child's pid, then, once it is reaped, its
    return code (``-N``: killed by signal N)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection to answer
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 0.02)
        if sys.stdin in readable and not sys.stdin.readline():  # the pytest worker is gone
            break
        if listener in readable:
            conn, _ = listener.accept()
            data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
            request = json.loads(data)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in waiting.values():
                    other.close()
                conn.close()
                if request["env"].get("FWK_TEST_FORK_RANKS", "1") != "0":
                    from tests import forked_ranks

                    forked_ranks.install()
                become("fwk", request["args"], request["env"], request["cwd"], fds, request["new_session"])
            for fd in fds:
                os.close(fd)
            conn.send(str(pid).encode())
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(str(os.waitstatus_to_exitcode(status)).encode())
                except OSError:
                    pass  # the test stopped waiting
                conn.close()


class Server:
    """The client side: one server per pytest worker, started on first use."""

    def __init__(self, env: dict[str, str]) -> None:
        self._env = {**env, "PYTHONUNBUFFERED": "1"}  # the test session's, before any test changed it
        self._proc: subprocess.Popen | None = None
        self._path = ""

    def _start(self) -> str:
        if self._proc is None or self._proc.poll() is not None:
            self._path = tempfile.mktemp(prefix="fwk-zygote-", suffix=".sock")
            # the checkout's fwk and tests, wherever pytest runs from (an installed fwk may be another's)
            root = str(Path(__file__).parents[1])
            path = os.pathsep.join(filter(None, [root, self._env.get("PYTHONPATH")]))
            self._proc = subprocess.Popen(
                [sys.executable, "-c", f"from tests.zygote import serve; serve({self._path!r})"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**self._env, "PYTHONPATH": path},
                text=True,
            )
            line = self._proc.stdout.readline()
            assert line.strip() == "ready", f"the fork server did not start: {line!r}"
        return self._path

    def popen(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: str | None = None,
        start_new_session: bool = False,
        stdin: Any = None,
    ) -> Forked:
        path = self._start()
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        request = {"args": args, "env": env, "cwd": str(cwd or os.getcwd()), "new_session": start_new_session}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(path)
        with open(os.devnull, "rb") if stdin is None else nullcontext(stdin) as source:
            socket.send_fds(conn, [json.dumps(request).encode()], [source.fileno(), out.fileno(), err.fileno()])
        return Forked(conn, out, err, args)


class Forked:
    """What ``subprocess.Popen`` offers the tests, for a command the server forked."""

    def __init__(self, conn: socket.socket, out: Any, err: Any, args: list[str]) -> None:
        self.args = [sys.executable, "-m", "fwk", *args]
        self._conn, self._out, self._err = conn, out, err
        self.pid = int(conn.recv(64))
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._finish()
        return self.returncode

    def _finish(self) -> None:
        answer = self._conn.recv(64)
        assert answer, "the fork server closed the connection before the command ended"
        self.returncode = int(answer)
        self._conn.close()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self._read(self._out), self._read(self._err)

    @staticmethod
    def _read(f: Any) -> str:
        f.seek(0)
        text = f.read().decode(errors="replace")
        f.close()
        return text


SERVER = Server(dict(os.environ))  # imported by tests/conftest.py once it has set the session's variables


def popen(args: list[str], env: dict[str, str], **kw: Any) -> Forked | subprocess.Popen:
    """``python -m fwk ARGS`` started as a fork of the server, or as a fresh interpreter
    (``FWK_TEST_FORK=0``); stdout and stderr captured as text."""
    if ENABLED:
        return SERVER.popen(args, env, **kw)
    return subprocess.Popen(
        [sys.executable, "-m", "fwk", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def run(
    args: list[str], env: dict[str, str], timeout: float, input: str | None = None, **kw: Any
) -> subprocess.CompletedProcess:
    """``subprocess.run(..., capture_output=True, text=True)`` of ``python -m fwk ARGS`` (see ``popen``)."""
    argv = [sys.executable, "-m", "fwk", *args]
    with tempfile.TemporaryFile() as stdin:
        if input is not None:
            stdin.write(input.encode())
            stdin.seek(0)
        proc = popen(args, env, stdin=stdin if input is not None else None, **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
