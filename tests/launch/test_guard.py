"""The run's flock (one machine) and its lease (several) consult each other: the same run
cannot be launched once as one node and once as two into one directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fwk.errors import UserError
from fwk.launch.guard import guarded
from fwk.track import lease
from fwk.track.store import RunDir
from tests.track.test_lease import _held, _quick  # noqa: F401  (_quick: the autouse fixture, a short SETTLE)


def test_a_one_machine_launch_and_a_several_machine_launch_refuse_each_other(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    with guarded(run, 1, ""):
        with pytest.raises(UserError, match=r"^run .* is already running on this machine, launched for one machine"):
            with guarded(run, 2, "rendezvous n1:15007"):
                pass
    assert not (tmp_path / lease.LEASE).exists()
    _held(tmp_path, "rendezvous n1:15007", age=2)
    with pytest.raises(UserError) as err, guarded(run, 1, ""):
        pass
    assert str(err.value).startswith(
        f"run {run.id} is already running on several machines as rendezvous n1:15007 (host node7, pid 4242; "
    )
    _held(tmp_path, "rendezvous n1:15007", age=lease.STALE_AFTER + 1)  # its launchers are gone
    with guarded(run, 1, ""):
        pass
    with guarded(run, 2, "rendezvous n2:15008"):  # and a multi-node launch takes the stale lease over
        assert json.loads((tmp_path / lease.LEASE).read_text())["key"] == "rendezvous n2:15008"
