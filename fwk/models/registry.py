"""Model registry: ``model.name`` in the config is a function name here.

Torch-free: the config dataclasses are in fwk/models/configs.py, the builders (torch) in
the modules below, imported on the first builder lookup.
"""

from fwk.registry import Registry

MODELS = Registry(
    "model",
    configs="fwk.models.configs",
    builders=("fwk.models.cnn", "fwk.models.gpt", "fwk.models.vision", "fwk.models.hf"),
)
register_model = MODELS.register
