"""The communication monitor of DDP runs, and what it changes when ranks wait too long.

Every rank measures, per logging window, the time the backward pass waits for the gradient
all-reduce after its last gradient bucket is ready. That is the communication that compute
did not hide. The time spent in explicit collectives is added, and the sum is taken as a
share of the window's wall time. The share is all-reduced, max over ranks, so that every
rank takes the same decision, and it is in every metrics row as ``comm_wait``.

When it stays above ``parallel.adapt.threshold`` for ``parallel.adapt.windows`` windows
in a row, and ``parallel.adapt.enabled`` is true, the next rung of the ladder is taken at
that step boundary, and said with the share before. The next window's share is said as
"after". Adapting is opt-in because its rungs change the numbers a run computes. They also
depend on timing, so two runs may adapt at different steps. When it is off, the high
share is said once with the settings that would help.

1. gradient compression: the fp16 compression hook, or bf16 under bf16 autocast.
2. bigger buckets: ``bucket_cap_mb`` x4, up to ``adapt.max_bucket_mb``, with DDP rebuilt.
3. more accumulation: ``train.accum_steps`` x2, up to ``adapt.max_accum_steps``, which halves
   the all-reduces per sample.

What was changed is saved in checkpoints, so a resumed run continues with it.

On CUDA the two ends of the wait are CUDA events recorded on the compute stream, read
only at the window's end, so there is no sync per step. On CPU they are host clocks.

``FWK_DEBUG_SLOW_RANK=R:SECONDS`` delays rank R's all-reduce by SECONDS every step. That is
how the tests make one rank's gloo traffic slow on purpose.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from fwk.config.schema import ParallelConfig
from fwk.distributed.collectives import all_reduce_max
from fwk.distributed.group import Dist

if TYPE_CHECKING:
    from fwk.strategies.step_plan import StepPlan

logger = logging.getLogger(__name__)

Hook = Callable[[Any, Any], torch.futures.Future]


def _slow_seconds(rank: int) -> float:
    spec = os.environ.get("FWK_DEBUG_SLOW_RANK", "")
    if not spec:
        return 0.0
    who, seconds = spec.split(":")
    return float(seconds) if int(who) == rank else 0.0


class _Clock:
    """A clock of host time on CPU. On CUDA it records events on the current stream, resolved later."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pending: list[tuple[Any, Any]] = []
        self.seconds = 0.0

    def now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def span(self, start: Any, end: Any) -> None:
        if self.cuda:
            self.pending.append((start, end))
        else:
            self.seconds += end - start

    def take(self) -> float:
        if self.pending:
            self.pending[-1][1].synchronize()
            self.seconds += sum(a.elapsed_time(b) for a, b in self.pending) / 1000.0
            self.pending.clear()
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class Replicated(nn.Module):
    """DDP around ``model``, with one comm hook registered for good, since DDP allows only one.
    The hook times the wait and calls whichever compression is current."""

    def __init__(self, model: nn.Module, cfg: ParallelConfig, dist: Dist, amp_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.cfg, self.dist, self.amp_dtype = cfg, dist, amp_dtype
        self.inner = model
        self.bucket_cap_mb = cfg.bucket_cap_mb
        self.compression = cfg.comm_hook
        self.clock = _Clock(dist.device)
        self.slow = _slow_seconds(dist.rank)
        self._powersgd: Any = None
        self.ddp = self._build()

    # ---- DDP and its hook ------------------------------------------------------------
    def _build(self) -> DistributedDataParallel:
        old = self.__dict__.get("_modules", {}).pop("ddp", None)
        if old is not None:  # free the old reducer (and its autograd hooks) before the new one
            del old
            gc.collect()
        ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
        ddp = DistributedDataParallel(
            self.inner,
            device_ids=ids,
            find_unused_parameters=self.cfg.find_unused_parameters,
            bucket_cap_mb=self.bucket_cap_mb,
            gradient_as_bucket_view=self.cfg.gradient_as_bucket_view,
            static_graph=self.cfg.static_graph,
        )
        ddp.register_comm_hook(None, self._hook)
        return ddp

    def _inner_hook(self) -> tuple[Any, Hook]:
        if self.compression == "fp16":
            return None, default_hooks.fp16_compress_hook
        if self.compression == "bf16":
            return None, default_hooks.bf16_compress_hook
        if self.compression == "powersgd":
            if self._powersgd is None:
                self._powersgd = powerSGD_hook.PowerSGDState(
                    process_group=None,
                    matrix_approximation_rank=self.cfg.powersgd_rank,
                    start_powerSGD_iter=self.cfg.powersgd_start,
                )
            return self._powersgd, powerSGD_hook.powerSGD_hook
        return None, default_hooks.allreduce_hook

    def _hook(self, _, bucket):  # unannotated: DDP accepts only its own types there
        if self.slow:
            time.sleep(self.slow)
        state, hook = self._inner_hook()
        fut = hook(state, bucket)
        if bucket.is_last():
            # every gradient is computed: from here the backward only waits for communication.
            # DDP queues its end-of-backward callback, which waits for every all-reduce, right
            # after this hook returns. A callback queued from a callback runs after it.
            ready = self.clock.now()
            engine = torch.autograd.Variable._execution_engine

            def done() -> None:
                self.clock.span(ready, self.clock.now())

            engine.queue_callback(lambda: engine.queue_callback(done))
        return fut

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.ddp(*args, **kwargs)

    def rebuild(self) -> None:
        """Build DDP again over the model's current parameters, after a method replaced some."""
        self.ddp = self._build()

    def no_sync(self) -> Any:
        return self.ddp.no_sync()

    # ---- what the monitor changes ----------------------------------------------------
    def compress(self) -> str:
        self.compression = "bf16" if self.amp_dtype == torch.bfloat16 else "fp16"
        return f"turned on {self.compression} gradient compression"

    def grow_buckets(self, limit: float) -> str:
        before = self.bucket_cap_mb
        self.bucket_cap_mb = min(before * 4, limit)
        self.ddp = self._build()
        return f"grew DDP buckets {before:g} -> {self.bucket_cap_mb:g} MB"

    def settings(self) -> dict[str, Any]:
        return {"compression": self.compression, "bucket_cap_mb": self.bucket_cap_mb}

    def apply_settings(self, state: dict[str, Any]) -> None:
        self.compression = state["compression"]
        if state["bucket_cap_mb"] != self.bucket_cap_mb:
            self.bucket_cap_mb = state["bucket_cap_mb"]
            self.ddp = self._build()


class CommMonitor:
    """A monitor of the share of each window's time spent waiting on collectives.

    It adapts when the share stays high."""

    def __init__(self, cfg: ParallelConfig, dist: Dist, plan: StepPlan, model: nn.Module) -> None:
        """Watch ``model`` when it is ``Replicated``. ``plan`` is the run's step plan, whose
        accumulation the last rung raises."""
        self.cfg, self.dist = cfg.adapt, dist
        self.replicated = model if isinstance(model, Replicated) else None
        self.plan = plan
        self.high = 0  # consecutive windows above the threshold
        self.changes: list[str] = []
        self._pending: tuple[str, float] | None = None  # (what changed, share before)
        self.share = 0.0
        self.advised = False
        self._started = time.perf_counter()
        self._explicit = self.dist.collective_s.total

    @property
    def active(self) -> bool:
        return self.replicated is not None

    def window(self, step: int) -> dict[str, float]:
        """Return the row's ``comm_wait``, the max over ranks. Every rank calls it at each log step."""
        if self.replicated is None:
            return {}
        now = time.perf_counter()
        waited = self.replicated.clock.take() + self.dist.collective_s.total - self._explicit
        share = waited / max(now - self._started, 1e-9)
        self.share = all_reduce_max([share], self.dist)[0]
        self._started, self._explicit = time.perf_counter(), self.dist.collective_s.total
        return {"comm_wait": self.share}

    def adapt(self, step: int) -> None:
        """Say what the last change did, and take the next rung when due. It runs after the log step's row."""
        if self.replicated is None:
            return
        share = self.share
        if self._pending is not None:
            what, before = self._pending
            logger.info(f"step {step}: after '{what}': communication wait {share:.0%} of step time (was {before:.0%})")
            self._pending = None
        self.high = self.high + 1 if share > self.cfg.threshold else 0
        if self.high < self.cfg.windows:
            return
        if self.cfg.enabled:
            self._take_rung(step, share)
        elif not self.advised:
            self.advised = True
            logger.info(
                f"step {step}: communication wait {share:.0%} of step time for {self.cfg.windows} windows "
                f"(> parallel.adapt.threshold={self.cfg.threshold:g}); parallel.adapt.enabled=true lets fwk adapt "
                "(compression, then bigger buckets, then more accumulation), or set parallel.comm_hook=fp16"
            )

    def _take_rung(self, step: int, share: float) -> None:
        r = self.replicated
        assert r is not None
        if r.compression == "none":
            what = r.compress()
        elif r.bucket_cap_mb < self.cfg.max_bucket_mb:
            what = r.grow_buckets(self.cfg.max_bucket_mb)
        else:
            what = self.plan.accumulate_more(self.cfg.max_accum_steps)
            if what is None:
                return
        self.high = 0
        # the next window starts after the change (rebuilding DDP is not step time)
        self._started, self._explicit = time.perf_counter(), self.dist.collective_s.total
        self.changes.append(f"step {step}: {what}")
        self._pending = (what, share)
        logger.info(
            f"step {step}: communication wait {share:.0%} of step time for {self.cfg.windows} windows "
            f"(> parallel.adapt.threshold={self.cfg.threshold:g}): {what}"
        )

    def summary(self) -> dict[str, Any]:
        return {"comm_adaptations": self.changes} if self.active else {}

    def state_dict(self) -> dict[str, Any]:
        replicated = self.replicated.settings() if self.replicated is not None else {}
        # the accumulation is the plan's; the monitor's state carries it (its last rung raises it)
        return {"accum_steps": self.plan.accum_steps, "changes": list(self.changes), "replicated": replicated}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.plan.resume(int(state["accum_steps"]))
        self.changes = list(state["changes"])
        if self.replicated is not None and state["replicated"]:
            self.replicated.apply_settings(state["replicated"])
