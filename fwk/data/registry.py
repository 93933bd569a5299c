"""The dataset registry: ``data.name`` in the config is a function name here.

It is torch-free. The config dataclasses are in fwk/data/configs.py, and the builders, which
use torch, in the modules below, imported on the first builder lookup.
"""

from fwk.registry import Registry

DATA = Registry(
    "data",
    configs="fwk.data.configs",
    builders=("fwk.data.digits", "fwk.data.imagefolder", "fwk.data.synthetic", "fwk.data.text", "fwk.data.hf"),
    alone={"streaming": "fwk.data.streaming"},  # litdata: imported by a streamed run only
)
register_data = DATA.register
