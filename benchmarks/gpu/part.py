"""One part of ``make gpu-check``: what it runs on a GPU machine and, for ``--dry``, on the CPU.

It has a module of its own so that the list of parts (parts.py) and the driver that runs
them (check.py, which imports the list) both import it without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Part:
    """One check: the command on a GPU machine and, for --dry, on the CPU (None: CUDA only)."""

    name: str
    section: str
    what: str
    budget_s: float
    argv: list[str]
    dry_argv: list[str] | None = None
    dry_budget_s: float = 120.0
    env: dict[str, str] = field(default_factory=dict)
    dry_env: dict[str, str] = field(default_factory=dict)  # added to env in a --dry run
