"""Speed-up methods: small objects the loop calls at fixed points (``base.Method``), without naming any of them.

``methods=[ema,seq_warmup]`` picks them, and ``method.NAME.*`` holds their settings. Each is one
file, found by the registry (``fwk.config.methods.METHODS``), which imports every module of this
package. A folder ``X/fwk/methods/`` on ``sys.path`` (``PYTHONPATH=X``) adds its files to the
package, so a method of your own needs no change to fwk."""

from __future__ import annotations

import os
import sys


def _folders(own: list[str]) -> list[str]:
    """Return this package's folder, then each other ``fwk/methods`` folder on ``sys.path``, in its order."""
    folders, seen = list(own), {os.path.realpath(f) for f in own}
    for entry in sys.path:
        folder = os.path.join(entry or os.curdir, "fwk", "methods")
        if os.path.isdir(folder) and os.path.realpath(folder) not in seen:
            folders.append(folder)
            seen.add(os.path.realpath(folder))
    return folders


__path__ = _folders(__path__)
