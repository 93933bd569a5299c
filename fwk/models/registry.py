"""The model registry, in which ``model.name`` in the config is a function name.

It is torch-free. The config dataclasses are in fwk/models/configs.py, and the builders, which
import torch, are in the modules below. Those are imported on the first builder lookup.
"""

from fwk.registry import Registry

MODELS = Registry(
    "model",
    configs="fwk.models.configs",
    builders=("fwk.models.cnn", "fwk.models.gpt", "fwk.models.vision", "fwk.models.hf"),
)
register_model = MODELS.register
