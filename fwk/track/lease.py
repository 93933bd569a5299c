"""The lease of a multi-node run: which launch trains it, seen from any machine.

A run on one machine is guarded by its lock (``store.RunLock``: an flock, which only that
machine's kernel knows of). A run on several machines has a launcher on each, and the file
system they share is all they have in common. So each launcher keeps
``runs/<id>/lease.json`` fresh while its torchrun runs. The lease names its launch (the
SLURM job and the rendezvous endpoint: every machine of one launch has the same), the host
and pid that renewed it last, and when.

A launch of the same run under another launch is refused in one line while the lease is
fresh, and takes it over, saying so, once no one has renewed it for ``STALE_AFTER``
seconds. ``fwk runs`` reads a fresh lease as running, from any machine.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fwk.errors import UserError

logger = logging.getLogger(__name__)

LEASE = "lease.json"
INTERVAL = 5.0  # seconds between renewals
STALE_AFTER = 3 * INTERVAL  # three renewals missed: its launchers are gone
SETTLE = 1.0  # seconds a new holder waits, then reads the lease back: two launches that took it at once see who won


def launch_key(rdzv_endpoint: str, env: Mapping[str, str]) -> str:
    """Return what every machine of one launch shares and another launch of the run does not."""
    job = env.get("SLURM_JOB_ID")
    return f"SLURM job {job}, rendezvous {rdzv_endpoint}" if job else f"rendezvous {rdzv_endpoint}"


def read(run_path: Path) -> dict[str, Any] | None:
    try:
        lease = json.loads((run_path / LEASE).read_text())
    except (OSError, ValueError):
        return None  # none, or being replaced (write_atomic renames: never half-written)
    return lease if isinstance(lease, dict) and isinstance(lease.get("renewed"), (int, float)) else None


def fresh(run_path: Path, now: float | None = None) -> dict[str, Any] | None:
    """Return the lease while it is renewed, else None."""
    lease = read(run_path)
    if lease is None or (now if now is not None else time.time()) - lease["renewed"] >= STALE_AFTER:
        return None
    return lease


def describe(lease: dict[str, Any], now: float | None = None) -> str:
    age = (now if now is not None else time.time()) - lease["renewed"]
    return f"{lease.get('key')} (host {lease.get('host')}, pid {lease.get('pid')}; renewed {max(age, 0):.0f} s ago)"


class Lease:
    """Hold ``runs/<id>/lease.json`` for ``key`` while the block runs, renewing it every
    ``INTERVAL`` seconds from a thread. At the end it is removed if it is still this launch's."""

    def __init__(self, run_path: Path, run_id: str, key: str) -> None:
        self.path, self.run_id, self.key = run_path, run_id, key
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        from fwk.track.store import write_atomic

        mine = {"key": self.key, "host": socket.gethostname(), "pid": os.getpid(), "renewed": time.time()}
        write_atomic(self.path / LEASE, json.dumps(mine) + "\n")

    def _refuse(self, holder: dict[str, Any]) -> UserError:
        return UserError(
            f"run {self.run_id} is already running as {describe(holder)}; wait for it to finish, "
            f"or stop it; its lease is taken over once not renewed for {STALE_AFTER:.0f} s"
        )

    def __enter__(self) -> Lease:
        now = time.time()
        held = read(self.path)
        if held is not None and held.get("key") != self.key:
            if now - held["renewed"] < STALE_AFTER:
                raise self._refuse(held)
            logger.info(f"run {self.run_id}: took over the lease of {describe(held, now)}: its launch is gone")
        self._write()
        time.sleep(SETTLE)
        won = read(self.path)
        if won is not None and won.get("key") != self.key:  # another launch wrote after this one
            raise self._refuse(won)
        self._thread = threading.Thread(target=self._renew, name="fwk-lease", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        failed_since: float | None = None
        while not self._stop.wait(INTERVAL):
            held = read(self.path)
            if held is not None and held.get("key") != self.key:
                return self._give_up(f"its lease was taken over by {describe(held)}")
            try:
                self._write()
                failed_since = None
            except OSError as exc:
                failed_since = failed_since if failed_since is not None else time.monotonic() - INTERVAL
                if time.monotonic() - failed_since >= STALE_AFTER - INTERVAL:  # before another may take it over
                    return self._give_up(f"its lease could not be renewed for {STALE_AFTER - INTERVAL:.0f} s ({exc})")

    def _give_up(self, why: str) -> None:
        """Stop this launch as Ctrl-C does (its workers save and stop), since another launch
        may train the run now: two launches of one run would interleave their checkpoints."""
        logger.error(f"run {self.run_id}: {why}; stopping this launch")
        os.kill(os.getpid(), signal.SIGTERM)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        held = read(self.path)
        if held is not None and held.get("key") == self.key:
            (self.path / LEASE).unlink(missing_ok=True)
