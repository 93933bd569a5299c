"""The models, which are plain single-device PyTorch modules.

Parallelism is applied by the engine. Importing this package imports no torch: the builders
(cnn, gpt, vision) are imported by ``MODELS`` on the first builder lookup.
"""

from fwk.models.registry import MODELS, register_model

__all__ = ["MODELS", "register_model"]
