"""Models: plain single-device PyTorch modules. Parallelism is applied by the engine."""

from fwk.models import cnn, gpt, vision  # noqa: F401  (registers builders)
from fwk.models.registry import MODELS, register_model

__all__ = ["MODELS", "register_model"]
