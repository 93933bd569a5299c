"""Dataset registry: ``data.name`` in the config is a function name here."""

from fwk.data import digits, imagefolder, synthetic, text  # noqa: F401  (registers builders)
from fwk.data.base import DATA, DataBundle, register_data

__all__ = ["DATA", "DataBundle", "register_data"]
