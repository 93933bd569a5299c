"""fp32 islands under autocast: a module's forward runs with autocast off and its inputs cast up to fp32.

A shared ``Gate`` switches the islands on and off together, for precision's ``keep_fp32`` and
staged ``final_fp32``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class Gate:
    """A switch shared by the fp32 wrappers of one set of modules."""

    on = False


def _up(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
        return value.float()
    if isinstance(value, (tuple, list)):
        return type(value)(_up(v) for v in value)
    if isinstance(value, dict):
        return {k: _up(v) for k, v in value.items()}
    return value


def fp32_forward(gate: Gate, device_type: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrapper(forward: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if not gate.on:
                return forward(*args, **kwargs)
            with torch.autocast(device_type, enabled=False):
                return forward(*_up(args), **_up(kwargs))

        return run

    return wrapper
