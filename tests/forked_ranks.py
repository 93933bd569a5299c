"""torchrun's agent and ranks forked from a `fwk` command that has imported torch and fwk.

A two-process `fwk train` starts three interpreters: torchrun's agent and two workers, each
importing torch and fwk (~4.5 s of CPU apiece, 12-20 s a launch on 2 cores). About forty
tests launch two processes where what they test is the training (DDP, FSDP, resume, the
methods), not how its processes start. In the commands the fork server starts
(tests/zygote.py), ``install`` makes ``subprocess.Popen`` of ``python -m torch.distributed.run
...`` and of ``python -m fwk.launch.worker ...`` fork the calling process, which has both
imported, instead of exec-ing a new interpreter (torchrun does the same for a function entry
point with ``start_method=fork``). Everything else about the launch is as before:

- torchrun runs its own main with the same arguments, as the launcher's child in a session
  of its own, stderr to the run's torchrun.log, every other descriptor closed but the run
  lock's, its parent-death signal set (the launcher's ``preexec_fn``);
- each worker is the agent's child in a session of its own, with the environment torchrun
  gave it, running ``python -m fwk.launch.worker RUN_DIR``; signals, exit codes and
  ``subprocess.Popen``'s bookkeeping (pid, poll, wait) are those of real child processes.

What differs: a forked process's /proc cmdline is the fork server's, so
``fwk.launch.supervise.workers_of`` (which looks for worker command lines) does not see these
workers. The launcher's own process handling is tested with fresh interpreters
(tests/launch/test_supervise.py). ``FWK_TEST_FORK_RANKS=0`` in a command's environment, or
``FWK_TEST_FORK=0`` for the whole suite, gives real ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

FORKED = ("torch.distributed.run", "fwk.launch.worker")  # the modules a forked child may run
_Popen = subprocess.Popen


def install() -> None:
    """In a forked `fwk` command: torchrun's agent and workers are forks of this process."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    subprocess.Popen = ForkingPopen
    subprocess_handler.Popen = ForkingPopen  # bound by name when torch imported it


class ForkingPopen(_Popen):
    """``subprocess.Popen`` that runs ``python [-u] -m MODULE ARGS`` (MODULE in ``FORKED``) in a
    fork of this process instead of a new interpreter; any other command is exec-ed as usual."""

    def _execute_child(self, args: list[str], executable: Any, preexec_fn: Any, close_fds: bool, *rest: Any) -> None:
        command = [str(a) for a in args] if isinstance(args, (list, tuple)) else []
        at = command.index("-m") if "-m" in command else -1
        ours = at > 0 and command[0] == sys.executable and set(command[1:at]) <= {"-u"}
        if not ours or command[at + 1] not in FORKED:
            return super()._execute_child(args, executable, preexec_fn, close_fds, *rest)
        # Python 3.11's order after close_fds: pass_fds, cwd, env, startupinfo, creationflags,
        # shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid,
        # gids, uid, umask, start_new_session, process_group
        cwd, env = rest[1], rest[2]
        p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite = rest[6:12]
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            from tests.zygote import become

            env = dict(os.environ if env is None else env)
            fds = [p2cread, c2pwrite, errwrite]
            become(
                command[at + 1],
                command[at + 2 :],
                env,
                cwd,
                fds,
                new_session=rest[-2],
                close_fds=close_fds,
                pass_fds=tuple(rest[0]),
                preexec_fn=preexec_fn,
            )
        self.pid = pid
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
