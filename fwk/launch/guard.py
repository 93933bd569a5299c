"""What keeps two launches of one run apart: the run's flock on one machine, its lease on several.

They are two mechanisms (``fwk.track.store.RunLock``: an flock, which only that machine's
kernel knows of; ``fwk.track.lease.Lease``: a file on the shared run dir), so each launch
consults the other's too. A launch for one machine is refused while a multi-node launch's
lease is fresh, and a multi-node launch on a machine where the run's flock is held. A
one-machine launch on another machine writes no lease, so it is not seen from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fwk.errors import UserError
from fwk.track import lease
from fwk.track.lease import Lease
from fwk.track.status import lock_holder
from fwk.track.store import RunDir, RunLock


@contextmanager
def guarded(run: RunDir, nnodes: int, key: str) -> Iterator[RunLock | Lease]:
    """Hold the run for this launch while the block runs, or refuse in one line."""
    if nnodes == 1:
        with RunLock(run) as held:
            other = lease.fresh(run.path)  # taken after the flock: a lease written later sees the flock
            if other is not None:
                raise UserError(
                    f"run {run.id} is already running on several machines as {lease.describe(other)}; wait for it "
                    f"to finish, or stop it; its lease is taken over once not renewed for {lease.STALE_AFTER:.0f} s"
                )
            yield held
        return
    if lock_holder(run):
        raise UserError(
            f"run {run.id} is already running on this machine, launched for one machine "
            f"({run.path / '.lock'} is held); wait for it to finish, or stop it"
        )
    with Lease(run.path, run.id, key) as held:
        yield held
