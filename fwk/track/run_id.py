"""Content-addressed run ids: the same config on the same code is the same run."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import fwk
from fwk.distributed.dims import LAYOUT

# Folders whose content decides what a run computes; changes elsewhere (docs, tests) do not.
_CODE_DIRS = ("fwk", "conf", "recipes")
# Config keys that say where a run is stored, how it is labelled or where its results are
# sent, not what it computes. The same training with other tags is the same run, and it keeps
# the tags of its first launch. With another tracking it is the same run, tracked as this
# launch says.
_NOT_HASHED = ("paths", "tags", "tracking")
# Parallel fields that say where and on how many processes a run computes, not what. A SLURM
# job requeued onto other nodes gets another rendezvous host and must find its run again. With
# rdzv_backend=static every node has its own node_rank, but all share one run. The same
# training on another process count is the same run, which resumes there
# (fwk/distributed/resize.py), since train.batch_size is the global batch. So is the same
# training under another layout: the mesh splits the same global batch and the same model, and
# checkpoints reshard between them.
_NOT_HASHED_PARALLEL = (
    "rdzv_endpoint",
    "node_rank",
    "nproc_per_node",
    "nnodes",
    "min_nnodes",
    "rdzv_last_call_s",
    "collective_timeout_s",
    *LAYOUT,
)


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode(errors="replace")


def code_version() -> str:
    """Return `git:<commit>` plus a hash of uncommitted changes, or `fwk <version>` outside a
    checkout."""
    repo = Path(fwk.__file__).resolve().parents[1]
    commit = _git(repo, "rev-parse", "HEAD") if (repo / ".git").exists() else None
    if not commit:
        return f"fwk {fwk.__version__}"
    digest = hashlib.sha256()
    digest.update((_git(repo, "diff", "HEAD", "--binary", "--", *_CODE_DIRS) or "").encode())
    untracked = (_git(repo, "ls-files", "--others", "--exclude-standard", "--", *_CODE_DIRS) or "").split()
    for name in sorted(untracked):
        digest.update(name.encode() + b"\0" + (repo / name).read_bytes())
    dirty = bool(untracked) or bool(_git(repo, "diff", "HEAD", "--stat", "--", *_CODE_DIRS))
    return f"git:{commit.strip()[:12]}" + (f"+dirty.{digest.hexdigest()[:10]}" if dirty else "")


def identity(config: dict[str, Any]) -> dict[str, Any]:
    """Return the part of a resolved config that decides what a run computes, which is what its
    id hashes."""
    hashed = {k: v for k, v in config.items() if k not in _NOT_HASHED}
    if isinstance(hashed.get("parallel"), dict):
        hashed["parallel"] = {k: v for k, v in hashed["parallel"].items() if k not in _NOT_HASHED_PARALLEL}
    return hashed


def run_id(config: dict[str, Any], code: str, data: str = "", salt: str = "") -> str:
    """Hash the resolved config, code version, seed and the data's fingerprint into a
    10-hex-digit run id.

    The config leaves out storage paths, tags, tracking and the rendezvous location. ``salt``
    tells apart runs of one config that are meant to be separate, such as a replay and its
    original."""
    hashed = identity(config)
    fields: dict[str, Any] = {"config": hashed, "code": code, "seed": config.get("seed")}
    fields.update({k: v for k, v in (("data", data), ("salt", salt)) if v})
    payload = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:10]
