"""The check that a ``_target_`` names a module that is there to import.

The ``_target_`` is one such as ``model._target_=my_pkg.MyNet``. The check finds the module without
importing anything, so ``fwk train --dry-run`` stays torch-free. A module that is not installed is
one line at launch, instead of Hydra's ImportError from the build, which is said once per lookup,
three times in all."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def missing_module(target: str) -> str | None:
    """Return the top-level module of ``target`` if neither sys.path nor the working folder holds it.

    Otherwise return None. The top-level module of ``nosuch.Module`` is ``nosuch``. The working
    folder counts too, since torchrun starts the workers with ``python -m``, which imports from it,
    while the ``fwk`` script does not. Only the top level is sure. A deeper name may be a module's
    attribute, which only importing the module, and so mostly torch, would tell."""
    top = target.partition(".")[0]
    if not top or _on_sys_path(top):
        return None
    return None if importlib.machinery.PathFinder.find_spec(top, [os.getcwd()]) is not None else top


def import_from_working_folder(target: str) -> None:
    """Import the top-level module of ``target`` from the working folder when sys.path lacks it.

    torchrun's workers import from the working folder, and a run in one process must too, so
    that ``model._target_=my_model.Net`` means the same file in both. The module is loaded
    under its own name, and Hydra then finds it in ``sys.modules``. sys.path stays as it is.
    """
    top = target.partition(".")[0]
    if not top or top in sys.modules or _on_sys_path(top):
        return
    spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[top] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[top]  # a failed import leaves nothing behind: the build says what failed
        raise


def _on_sys_path(top: str) -> bool:
    """Tell whether sys.path holds the top-level module ``top``, without importing it."""
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):  # something is there but does not load: the build says what
        return True
