"""Model registry: ``model.name`` in the config is a function name here."""

from fwk.registry import Registry

MODELS = Registry("model")
register_model = MODELS.register
