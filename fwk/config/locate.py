"""Whether a ``_target_`` (``model._target_=my_pkg.MyNet``) names a module that is there to
import, found without importing anything: ``fwk train --dry-run`` stays torch-free, and a
module that is not installed is one line at launch instead of Hydra's ImportError from
the build (said once per lookup, three times in all)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os


def missing_module(target: str) -> str | None:
    """The top-level module of ``target`` (``nosuch`` of ``nosuch.Module``) when neither
    sys.path nor the working folder holds it, else None. The working folder too: torchrun
    starts the workers with ``python -m``, which imports from it, while the ``fwk`` script
    does not. Only the top level is sure: a deeper name may be a module's attribute, which
    only importing the module (and so, mostly, torch) would tell."""
    top = target.partition(".")[0]
    try:
        if not top or importlib.util.find_spec(top) is not None:
            return None
    except (ImportError, ValueError):  # something is there but does not load: the build says what
        return None
    return None if importlib.machinery.PathFinder.find_spec(top, [os.getcwd()]) is not None else top
