"""A per-user cache of composed configs, so that a command composed before skips Hydra.

Hydra's import and its composition take about 0.35 s of every ``fwk train``, ``--cfg`` and
``--dry-run``: a third of what fwk adds to a run's start-up. What they compute depends on
the overrides, the files of conf/ and recipes/, the schema and registries in fwk's own code,
the versions of Hydra and OmegaConf, and the environment variables the configs read
(``${oc.env:NAME}``). The cache key covers all of these. Files count by their size and
modification time, which a stat of each gives in about 2 ms. A change to any of them is a
new key, so a cached config is never stale.

Entries are JSON, under ``$XDG_CACHE_HOME/fwk/compose/``: reading one runs no code. Only a
successful composition is kept, so every mistake still goes through Hydra and gets its one
line. A config that JSON does not carry exactly is not kept. An entry that cannot be read is
a miss.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

_ENV = re.compile(r"oc\.env\s*:\s*([A-Za-z_][A-Za-z0-9_]*)")
_LIBRARIES = ("hydra", "omegaconf")
_VERSION = 1  # of the entries' layout
KEEP = 256  # entries: past this the oldest go


def _files(root: Path) -> list[tuple[str, int, int]]:
    """Return (path, size, mtime) of every file below ``root``, caches of bytecode left out."""
    out = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append((path, st.st_size, st.st_mtime_ns))
    return out


def _library(name: str) -> tuple[str, int, int] | None:
    """Stand in for a library's version: where its package is and when it was installed."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    st = os.stat(spec.origin)
    return (spec.origin, st.st_size, st.st_mtime_ns)


def key(overrides: list[str], resources: Path) -> str:
    """Return the cache key of composing ``overrides`` with the conf/ and recipes/ of ``resources``."""
    package = Path(__file__).resolve().parents[1]
    files = [f for folder in (package, resources / "conf", resources / "recipes") for f in _files(folder)]
    texts = [Path(p).read_text(errors="replace") for p, _, _ in files if p.endswith(".yaml")]
    names = sorted({m for text in [*texts, *overrides] for m in _ENV.findall(text)})
    described = {
        "version": _VERSION,
        "overrides": overrides,
        "files": files,
        "libraries": [_library(name) for name in _LIBRARIES],
        "env": {name: os.environ.get(name) for name in names},
    }
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:32]


def folder() -> Path:
    from fwk.track.store import cache_root

    return cache_root() / "compose"


def get(overrides: list[str], resources: Path) -> tuple[str, dict[str, Any] | None]:
    """Return the key of ``overrides`` and its composed config, or None when none is cached."""
    k = key(overrides, resources)
    entry = folder() / f"{k}.json"
    try:
        found = json.loads(entry.read_text())
        os.utime(entry)  # read now: the last to be pruned
    except (OSError, ValueError):
        return k, None
    return k, found if isinstance(found, dict) else None


def put(k: str, config: dict[str, Any]) -> None:
    """Keep ``config`` under ``k``, if JSON gives it back equal. A cache that cannot be written is skipped."""
    text = json.dumps(config)
    if json.loads(text) != config:  # a key that is not a string, a tuple: keep nothing rather than a changed config
        return
    try:
        from fwk.track.store import write_atomic

        folder().mkdir(parents=True, exist_ok=True)
        write_atomic(folder() / f"{k}.json", text)
        _prune()
    except OSError:
        pass


def _prune() -> None:
    """Remove the entries read or written least recently, past the newest ``KEEP``."""
    entries = sorted(folder().glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in entries[KEEP:]:
        old.unlink(missing_ok=True)
