"""The model repository of a running server: models, their versions, loading and warm-up.

Each version gets its own onnxruntime session and batcher; all share one thread pool
(sized to the cores) and its slots. A version takes traffic only once warmed up: it
runs ``warmup`` inferences at every batch size 1..max_batch_size, which also seeds the
batcher's run time per batch size (the adaptive delay is right from the first request).
Versions listed at start are loaded then (``--preload``: all; otherwise the stable and
canary ones), the others on their first request, warmed before it runs.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fwk.serve.batcher import Batcher
from fwk.serve.metrics import Metrics
from fwk.serve.models import ONNX, Export, Loaded, example, load
from fwk.serve.programs import Program, load_program
from fwk.serve.routing import Router
from fwk.serve.settings import ServeConfig

logger = logging.getLogger(__name__)


@dataclass
class Version:
    export: Export
    loaded: Loaded | Program | None = None
    batcher: Batcher | None = None
    warm_s: float | None = None  # seconds the warm-up took, once done
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Repository:
    def __init__(
        self,
        routers: dict[str, Router],
        exports: dict[str, dict[str, Export]],
        cfg: ServeConfig,
        threads: int,
        preload: bool = False,
    ) -> None:
        self.routers, self.cfg, self.threads, self.preload = routers, cfg, threads, preload
        self.versions = {m: {v: Version(e) for v, e in vs.items()} for m, vs in exports.items()}
        self.metrics = Metrics()
        self.ready = False
        self._executor: ThreadPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None

    def at_start(self) -> list[tuple[str, str]]:
        """List the (model, version) pairs loaded before the server is ready."""
        pairs = []
        for model, router in self.routers.items():
            for v in self.versions[model]:
                if self.preload or v in (router.stable, router.canary):
                    pairs.append((model, v))
        return pairs

    async def start(self) -> None:
        """Load and warm up the start-time versions, then turn ready."""
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="fwk-infer")
        self._slots = asyncio.Semaphore(self.threads)
        t0 = time.perf_counter()
        pairs = self.at_start()
        for model, v in pairs:
            await self.get(model, v)
        sizes = f"1..{self.cfg.max_batch_size}" if self.cfg.max_batch_size > 1 else "1"
        logger.info(
            f"ready: {len(pairs)} version(s) warmed up ({self.cfg.warmup} runs at batch sizes {sizes}) "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        # what exists now (modules, sessions, tables) lives as long as the server: out of the
        # collector's reach, a full collection under load walks only the requests' objects
        gc.freeze()
        self.ready = True

    async def get(self, model: str, version: str) -> Version:
        """Return the version, loaded and warmed up, now if it was not."""
        entry = self.versions[model][version]
        if entry.batcher is not None:
            return entry
        async with entry.lock:
            if entry.batcher is None:
                assert self._executor is not None and self._slots is not None, "start() first"
                loop = asyncio.get_running_loop()
                t0 = time.perf_counter()
                opens = load if entry.export.runtime == ONNX else load_program  # pt2, aoti, pte: torch
                loaded = await loop.run_in_executor(self._executor, opens, entry.export, self.cfg.intra_op_threads)
                batcher = Batcher(
                    loaded.run,
                    self._executor,
                    self._slots,
                    min(self.cfg.max_batch_size, entry.export.max_batch or self.cfg.max_batch_size),
                    self.cfg.max_delay_ms,
                    self.cfg.adaptive,
                    on_batch=self.metrics.on_batch(model, version),
                    max_queue_rows=self.cfg.max_queue_rows,
                    handles=loaded.handle,
                )
                await loop.run_in_executor(self._executor, self._warm_up, model, version, loaded, batcher)
                batcher.start()
                entry.loaded, entry.warm_s = loaded, time.perf_counter() - t0
                entry.batcher = batcher  # last: from here on the version takes traffic
                logger.info(
                    f"loaded {model} version {version} ({loaded.export.model_file.name}) in {entry.warm_s:.2f} s"
                )
        return entry

    def _warm_up(self, model: str, version: str, loaded: Loaded | Program, batcher: Batcher) -> None:
        for rows in range(1, batcher.max_batch_size + 1):
            x = example(loaded.input, rows)
            for _ in range(self.cfg.warmup):
                _, seconds = batcher.timed_run(x)
                batcher.record(rows, seconds)
                self.metrics.warmup.labels(model, version, str(rows)).inc()

    async def stop(self) -> None:
        """Finish queued batches, then stop the threads."""
        for versions in self.versions.values():
            for entry in versions.values():
                if entry.batcher is not None:
                    await entry.batcher.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
