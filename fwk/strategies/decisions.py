"""Measured decisions, made once per machine and model, then reused.

precision=auto's format, memory=auto's plan, jit=auto's verdict and loader=auto's workers
come from timings, and timings depend on how busy the machine is while they are taken.
Measured afresh in every run, the same command would compute different things on a busy
and on a quiet machine. As cuDNN's benchmark mode and Triton's autotuner do, fwk keeps
what it measured in a per-user cache, ``$XDG_CACHE_HOME/fwk/decisions/`` (default
``~/.cache``). A record's key is this machine (device, CPU, threads, torch version, world
size), the decision's name, the resolved config less the keys that cannot change what a
step costs, and the decisions made before it. Those keys are ``IGNORED``, and a new option is
in the key unless it is listed there. The decisions come in ``DECISION_ORDER``: precision,
then memory, then jit. A later run of the same model here reuses the record without trial
steps. A measuring run redoes its trial steps as decided (``fwk/components/trials.py``), so
both compute the same thing.

Where a decision comes from, first found first:

1. the checkpoint: a resumed run keeps what it decided, in each strategy's own state.
2. ``fwk replay``: the original run's records, so that the replay computes what the
   original computed on any machine.
3. this cache, unless ``auto.cache=false`` or ``--redecide``.
4. a measurement, whose record goes to the cache unless ``auto.cache=false``.

``fwk replay``'s records and ``--redecide`` reach the workers as the launch's orders
(``RunDir.orders``: ``{"replay": {name: record}}``, ``{"redecide": true}``). Rank 0 reads
and writes the cache, and every rank gets rank 0's answer, so all agree.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fwk.distributed.collectives import broadcast_object
from fwk.distributed.group import Dist
from fwk.strategies import hardware
from fwk.track.store import cache_root, write_atomic

DECISION_ORDER = ("precision", "memory", "jit")  # each decides on the result of those before it
# The config that cannot change what a timed step costs, as dotted paths into the resolved
# config: who and where, how long and how often the run evaluates, logs and saves, and
# the decision cache's own switch. Everything else is in a decision's key: model, data and its
# transforms, batch, optimizer, schedule, methods and every strategy's settings.
IGNORED = frozenset(
    {
        "recipe",  # a name: two recipes that compose the same config time the same steps
        "seed",
        "tags",
        "tracking",
        "paths",
        "auto",
        "checkpoint",
        "train.max_steps",  # the schedule's length: the lr changes, not a step's cost
        "train.eval_every",
        "train.eval_batches",
        "train.log_every",
        "train.stop_at",
        "train.early_stop_patience",
        "parallel.nnodes",  # the world size is in the machine's part
        "parallel.nproc_per_node",
        "parallel.node_rank",
        "parallel.rdzv_backend",
        "parallel.rdzv_endpoint",
        "parallel.max_restarts",
    }
)
Record = dict[str, Any]


def _keyed(config: Any, prefix: str = "") -> Any:
    """Return ``config`` less the ``IGNORED`` keys."""
    if not isinstance(config, dict):
        return config
    kept = {}
    for name, value in config.items():
        dotted = f"{prefix}{name}"
        if dotted not in IGNORED:
            kept[name] = _keyed(value, f"{dotted}.")
    return kept


def cache_dir() -> Path:
    return cache_root() / "decisions"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def machine(dist: Dist) -> dict[str, Any]:
    """Return what a timing depends on besides the config: the hardware and the software."""
    return {
        "device": hardware.probe(dist.device).text,
        "cpu": _cpu_model(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "world_size": dist.world_size,
    }


class Decisions:
    """The run's decisions, recalled from a replay or the cache, or kept once measured.

    ``records()`` goes to summary.json, and ``on_change`` hears of each one. The trainer's
    ``on_change`` writes env.json. ``orders`` are the launch's (``RunDir.read_orders``): a
    replay's records, or ``redecide``."""

    def __init__(self, cfg: Any, dist: Dist, cache: Path | None = None, orders: dict[str, Any] | None = None) -> None:
        self.dist = dist
        config = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)
        self._keyed = _keyed(config)
        orders = orders or {}
        self.read_cache = bool(cfg.auto.cache) and not orders.get("redecide")
        self.write_cache = bool(cfg.auto.cache)
        self.cache = cache or cache_dir()
        replayed = orders.get("replay")
        self.replayed: dict[str, Record] = replayed if dist.is_main and isinstance(replayed, dict) else {}
        self.made: dict[str, Record] = {}
        self.sources: dict[str, str] = {}
        self.on_change: Callable[[dict[str, Record]], None] = lambda records: None
        self._machine: dict[str, Any] | None = None

    def key(self, name: str) -> str:
        if self._machine is None:
            self._machine = machine(self.dist)
        earlier = DECISION_ORDER[: DECISION_ORDER.index(name)] if name in DECISION_ORDER else ()
        before = {n: self.made[n].get("choice") for n in earlier if n in self.made}
        parts = {
            "machine": self._machine,
            "decision": name,
            "config": self._keyed,
            "before": before,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]

    def path(self, name: str) -> Path:
        return self.cache / f"{name}-{self.key(name)}.json"

    def recall(self, name: str) -> tuple[Record | None, str]:
        """Return the record of ``name`` and "replayed" or "cached", or None and "" when it is to be measured.
        It is a collective."""
        found: tuple[Record | None, str] = (None, "")
        if self.dist.is_main:
            if name in self.replayed:
                found = (self.replayed[name], "replayed")
            elif self.read_cache:
                found = (self._read(name), "cached")
                found = found if found[0] is not None else (None, "")
        record, source = broadcast_object(found, self.dist)  # type: ignore[misc]
        return record, source  # the strategy keeps what it makes of it (``keep``)

    def _read(self, name: str) -> Record | None:
        try:
            data = json.loads(self.path(name).read_text())
        except (OSError, ValueError):
            return None  # absent, or unreadable: measured again and written over
        record = data.get("record") if isinstance(data, dict) else None
        return record if isinstance(record, dict) and "choice" in record else None

    def keep(self, name: str, record: Record, source: str = "measured") -> None:
        """Keep a decision made in this run in its records, and a measured one in the cache too."""
        if source == "measured" and self.write_cache and self.dist.is_main:
            try:
                path = self.path(name)
                path.parent.mkdir(parents=True, exist_ok=True)
                entry = {"decision": name, "machine": self._machine, "record": record}
                write_atomic(path, json.dumps(entry, indent=2, default=str) + "\n")
            except OSError:
                pass  # a read-only home: the decision holds for this run, and is measured next time
        self._note(name, record, source)

    def _note(self, name: str, record: Record, source: str) -> None:
        self.made[name], self.sources[name] = record, source
        if self.dist.is_main:
            self.on_change(self.records())

    def records(self) -> dict[str, Record]:
        """Return name -> record, with where each came from as ``source``."""
        return {n: {**r, "source": self.sources[n]} for n, r in self.made.items()}
