"""Run torchrun so that the terminal sees fwk's lines, not torchrun's.

- torchrun starts in its own session: a Ctrl-C in the terminal reaches this launcher
  only. The launcher passes SIGINT / SIGTERM / SIGUSR1 / SIGHUP on to the workers themselves
  (each saves a checkpoint at its next log step and exits 0), waits, and exits 128 + the
  signal number: 130 for Ctrl-C, 143 for SIGTERM, 138 for SIGUSR1 (a batch system's
  preemption notice, see fwk/launch/slurm.py), 129 when the terminal closes. A second
  signal kills the workers at once, except a repeated SIGUSR1: SLURM may deliver it to
  every process of the job step, which is also why torchrun itself ignores SIGUSR1.
- torchrun's own stderr (banner, elastic warnings, its ChildFailedError report) goes to
  ``runs/<id>/logs/torchrun.log``; each worker sends its stderr, and every rank but 0 also
  its stdout, to ``runs/<id>/logs/rank<R>.log`` (``redirect_worker_output``).
- A failed run ends with one line: a worker's own ``fwk: error:`` line if one wrote it,
  otherwise which rank failed, how, the last line it wrote, and where the logs are.
- Threads per rank are set here (cores / local processes) so that torchrun does not set
  and announce OMP_NUM_THREADS=1 itself.
- No worker outlives torchrun's agent: each asks the kernel for SIGKILL when its parent
  dies (``die_with_agent``). When the agent is killed (the OOM killer, a node problem) the
  launcher waits for the run's workers to be gone, says so in one line and exits 128 + the
  signal: the run is interrupted at its last checkpoint, and holds its lock until then.
- Nor does a run outlive its launcher unlocked: torchrun's agent gets SIGTERM when the
  launcher dies (SIGKILL, a crash) and passes it on, so the workers save a checkpoint and
  exit as on SIGTERM; and the agent holds the run lock's descriptor, so the lock is released
  only once the agent, and with it every worker, has exited.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

LOG_DIR_ENV = "FWK_LOG_DIR"
LAUNCHER_ENV = "FWK_LAUNCHER_PID"  # the launcher that started torchrun: the workers' grandparent
PR_SET_PDEATHSIG = 1  # prctl(2) option: a signal for this process when its parent dies


def _children_by_parent() -> dict[int, list[int]]:
    """Map every process to its direct children, by parent pid, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # the command name (2nd field) may hold spaces: the ppid is the 2nd field after ")"
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    return children


def _children(pid: int) -> list[int]:
    return _children_by_parent().get(pid, [])


def descendants(pid: int) -> list[int]:
    """List all of ``pid``'s descendants, also those in sessions of their own, which its
    process group misses. fwk's launcher starts torchrun in one, and torchrun its workers."""
    children, found, todo = _children_by_parent(), [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def threads_per_rank(nproc_per_node: int) -> int:
    return max(1, (os.cpu_count() or 1) // nproc_per_node)


def run_torchrun(argv: list[str], log_dir: Path, nproc_per_node: int, keep_fds: tuple[int, ...] = ()) -> int:
    """Run torchrun's command line, and return the exit status fwk should exit with.

    ``keep_fds`` stay open in torchrun's agent: the run lock's, so that the lock is held
    until the agent, which outlives its workers, has exited (fwk.track.store.RunLock)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    threads = threads_per_rank(nproc_per_node)
    env = {**os.environ, LOG_DIR_ENV: str(log_dir), "OMP_NUM_THREADS": str(threads), LAUNCHER_ENV: str(os.getpid())}
    logger.info(f"{nproc_per_node} processes x {threads} threads (OMP_NUM_THREADS); logs: {log_dir}")
    with open(log_dir / "torchrun.log", "a") as torchrun_log:
        start = {p: p.stat().st_size for p in log_dir.glob("rank*.log")}
        # torchrun ignores SIGUSR1. SIG_IGN is inherited, and the workers' training loops set
        # their own handler. SLURM may signal every process of a job step, and by default USR1
        # would end torchrun and orphan its workers in the middle of their checkpoint.
        usr1 = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                stderr=torchrun_log,
                start_new_session=True,
                pass_fds=keep_fds,
                preexec_fn=_stop_with(os.getpid()),
            )
        except BaseException:
            signal.signal(signal.SIGUSR1, usr1)
            raise
        stopping: list[int] = []

        def forward(signum: int, frame: object) -> None:
            if signum == signal.SIGUSR1 and signum in stopping:
                return  # the workers were told already
            stopping.append(signum)
            workers = _children(proc.pid)
            if len(stopping) > 1 or not workers:  # a second signal, or no workers yet: stop at once
                for pid in [*workers, proc.pid]:
                    _kill(pid, signal.SIGKILL if len(stopping) > 1 else signal.SIGTERM)
                return
            for pid in workers:
                _kill(pid, signum)

        stops = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)  # SIGHUP: the terminal closed
        previous = {s: signal.signal(s, forward) for s in stops}
        previous[signal.SIGUSR1] = usr1  # as it was before torchrun started
        try:
            status = proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    if stopping:
        return 128 + stopping[0]
    if status < 0:  # the agent itself was killed by a signal: its workers die with it
        left = _stop_workers(log_dir.parent)
        name = signal.Signals(-status).name
        print(
            f"fwk: error: torchrun's agent (pid {proc.pid}) was killed by {name} (as the kernel's OOM killer or a "
            f"node failure does){left}; run {log_dir.parent.name} is interrupted at its last checkpoint: run the "
            "same command to resume it",
            file=sys.stderr,
        )
        return 128 - status
    if status != 0:
        print(f"fwk: error: {failure_line(log_dir, start)}", file=sys.stderr)
        return 2 if _user_error(log_dir, start) else 1
    return 0


def workers_of(run_dir: Path) -> list[int]:
    """List the live worker processes of the run in ``run_dir``
    (``python -m fwk.launch.worker <run_dir>``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        ours = b"fwk.launch.worker" in argv and os.fsencode(run_dir) in argv
        if ours and b"torch.distributed.run" not in argv and state != "Z":  # torchrun's argv names them too
            found.append(int(entry.name))
    return found


def _stop_workers(run_dir: Path, grace_s: float = 10.0) -> str:
    """Wait for the run's workers to die with their agent, and SIGKILL them after ``grace_s``.
    Return what happened, for fwk's line."""
    deadline = time.monotonic() + grace_s
    while (left := workers_of(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        _kill(pid, signal.SIGKILL)
    return f"; {len(left)} worker(s) still alive were killed" if left else "; its workers were stopped with it"


def _parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies, on Linux. Return
    whether it took."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0


def _stop_with(launcher: int) -> Callable[[], None]:
    """Make torchrun's agent, between fork and exec, get SIGTERM when the launcher dies, by
    SIGKILL or a crash. torchrun passes it on to the workers, who save a checkpoint and exit as
    on Ctrl-C, and the agent holds the run lock until they have. When the launcher is already
    gone, exit."""

    def preexec() -> None:
        if _parent_death_signal(signal.SIGTERM) and os.getppid() != launcher:
            os._exit(128 + signal.SIGTERM)

    return preexec


def die_with_agent() -> None:
    """Make a worker under fwk's torchrun get SIGKILL when the agent, its parent, dies. Exit at
    once if the agent died already: the worker's parent is then no longer a child of the
    launcher."""
    launcher = os.environ.get(LAUNCHER_ENV)
    if launcher is None or not _parent_death_signal(signal.SIGKILL):
        return  # no parent-death signal here: the launcher's scan (_stop_workers) still ends the worker
    try:
        grandparent = int(Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return
    if grandparent != int(launcher):  # the agent died before prctl: this worker was reparented
        os._exit(128 + signal.SIGKILL)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _new_text(path: Path, start: dict[Path, int]) -> str:
    """Return what this launch appended to a log."""
    with open(path, errors="replace") as f:
        f.seek(start.get(path, 0))
        return f.read()


def _user_error(log_dir: Path, start: dict[Path, int]) -> str | None:
    """Return a worker's own one-line error of this launch, rank 0's first, if one wrote it."""
    logs = sorted(log_dir.glob("rank*.log"), key=lambda p: int(p.stem[4:]))
    for log in logs:
        lines = [line for line in _new_text(log, start).splitlines() if line.startswith("fwk: error: ")]
        if lines:
            return lines[-1].removeprefix("fwk: error: ")
    return None


def failure_line(log_dir: Path, start: dict[Path, int]) -> str:
    """Say in one line why the workers failed, from the logs of this launch."""
    own = _user_error(log_dir, start)
    if own is not None:
        return own
    report = _new_text(log_dir / "torchrun.log", start) if (log_dir / "torchrun.log").exists() else ""
    # torchrun's last report lists every failed rank and names the first it observed. The
    # others are usually ranks it stopped itself. But a rank that aborted with SIGABRT, as its
    # collective's peer vanished, is reacting to a peer that died in the same instant. When
    # another rank failed otherwise, that one is the cause.
    report = report.rsplit("Failures:", 1)[-1]
    pattern = r"rank\s*:\s*(\d+)\s*\(local_rank[^)]*\)\s*exitcode\s*:\s*(-?\d+)"
    root = re.findall(pattern, report.rsplit("Root Cause (first observed failure)", 1)[-1])
    ranks = root + [r for r in re.findall(pattern, report) if r not in root]
    if not ranks:
        return f"the workers failed; see {log_dir}"
    causes = [r for r in ranks if int(r[1]) != -signal.SIGABRT]
    rank, code = (int(x) for x in (causes or ranks)[0])
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    log = log_dir / f"rank{rank}.log"
    last = [line.strip() for line in _new_text(log, start).splitlines() if line.strip()] if log.exists() else []
    said = f"; its last line: {last[-1][:300]}" if last else ""
    return f"rank {rank} failed ({how}){said}; full logs: {log_dir}"


def redirect_worker_output(rank: int) -> None:
    """In a worker started by run_torchrun, send its stderr, and its stdout but for rank 0, to
    its log file.

    Done on the file descriptors, so C++ and library output is caught too.
    """
    log_dir = os.environ.get(LOG_DIR_ENV)
    if not log_dir:
        return
    log = os.open(Path(log_dir) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 2)
    if rank != 0:
        os.dup2(log, 1)
    os.close(log)
