"""Trial steps: the steps a measured decision times, redone once it is made.

precision=auto times its candidate formats on real training steps, memory=auto its plans,
jit=auto compiled steps against eager ones. Those steps compute what a run that recalled the
same decision (from the cache, a replay or a checkpoint) never computes: another format,
another plan, compiled where it then stays eager. So that a run's result does not depend on
whether its decisions were measured or recalled, the loop takes a snapshot when a strategy
starts trying (``TrainStep.trying``); once the decision is made it restores the snapshot
(model, optimizer, schedule, methods, diagnostics, every RNG stream), hands out the same
batches again (``Replayable``) and redoes those steps as decided. The cost: the trial steps
run twice. While a snapshot is held the loop logs, evaluates and saves nothing, since those
steps are redone; the training clock keeps counting (the trial's time is the user's too).
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from fwk.components.host_copy import host_copy
from fwk.components.resumable import Resumable
from fwk.components.train_state import load_model_state, rng_state, set_rng_state

logger = logging.getLogger(__name__)

# Checkpoint parts a trial leaves alone. The time spent stays, since a trial's seconds are real,
# and the data position, since the batches are replayed. So does what moves only at logged steps
# or evaluations, which trial steps skip: the DDP monitor's adaptations and the best checkpoint.
# What is derived stays too.
KEPT = frozenset({"clock", "loader", "comm", "best", "eval_weights"})


class Replayable:
    """The loader's batches, recorded while a trial runs and handed out again after it. Its
    position (``state_dict``, what a checkpoint stores) is that of the batches handed out,
    not of those the loader has produced."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._source: Iterator[Any] | None = None
        self._queue: deque[tuple[Any, Any]] = deque()  # (batch, loader position after it)
        self._recorded: list[tuple[Any, Any]] | None = None
        self._position: Any = None  # while the queue is handed out: the position of its last batch out
        self._start: Any = None

    def __iter__(self) -> Replayable:
        return self

    def __next__(self) -> Any:
        if self._queue:
            batch, position = self._queue.popleft()
            self._position = position if self._queue else None  # then the loader is there itself
        else:
            if self._source is None:
                self._source = iter(self.loader)
            batch = next(self._source)
            position = copy.deepcopy(self.loader.state_dict()) if self._recorded is not None else None
        if self._recorded is not None:
            self._recorded.append((batch, position))
        return batch

    def record(self) -> None:
        self._recorded = []
        self._start = copy.deepcopy(self.state_dict())

    def replay(self) -> None:
        """Hand out what was recorded since ``record()`` again, before anything else. The
        position goes back to where the recording began."""
        assert self._recorded is not None, "record() first"
        self._queue.extendleft(reversed(self._recorded))
        self._recorded = None
        self._position = self._start if self._queue else None

    def stop(self) -> None:
        """Keep what was recorded as handed out, for a trial that could not be redone."""
        self._recorded = None

    def state_dict(self) -> Any:
        return self._position if self._position is not None else self.loader.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.loader.load_state_dict(state)


class Trials:
    """The snapshot of one trial. It is taken before the trial's first step and restored after
    its decision."""

    def __init__(
        self,
        step_fn: Any,
        resumable: Resumable,
        batches: Replayable,
        counters: Iterable[Any],
    ) -> None:
        """Set up the trials. ``counters`` are the loop's own accumulators, such as the logging
        window, and are restored too."""
        self.step_fn, self.resumable, self.batches = step_fn, resumable, batches
        self.counters = list(counters)
        self._held: tuple[int, dict[str, Any], dict[str, Any], list[Any], bool] | None = None

    @property
    def active(self) -> bool:
        """Tell whether this step is a trial step, one that will be redone. Such a step logs,
        evaluates and saves nothing."""
        return self._held is not None

    def before(self, step: int) -> None:
        """Take the snapshot when a strategy starts trying. It is called before ``step``, after
        ``TrainStep.begin``."""
        if self._held is None and self.step_fn.trying:
            # before the first step the optimizer has no state, and must have none again when
            # the trial is redone: torch.distributed.checkpoint's get_state_dict (FSDP) makes
            # one by a step at lr 0 that counts a step (Adam's bias correction then differs)
            fresh = not self.resumable.optimizer.state
            state = {k: v for k, v in self.resumable.state_dict(step).items() if k not in KEPT}
            counters = [copy.deepcopy(c.state_dict()) for c in self.counters]
            self._held = (step, host_copy(state), rng_state(), counters, fresh)
            self.batches.record()

    def after(self, done: int) -> int | None:
        """Restore the snapshot after a step once no strategy is trying any more, and return
        the step to go on from, the trial's first. ``done`` is the number of steps taken.
        Return None otherwise."""
        if self._held is None or self.step_fn.trying:
            return None
        step, state, rng, counters, fresh = self._held
        self._held = None
        load_model_state(self.resumable.model, self.resumable.optimizer, state)
        if fresh:
            self.resumable.optimizer.state.clear()
        for name, part in self.resumable.parts.items():
            if name in state:
                rewind = getattr(part, "rewind", None)  # a strategy keeps what it decided meanwhile
                (rewind or part.load_state_dict)(state[name])
        for counter, saved in zip(self.counters, counters, strict=True):
            counter.load_state_dict(saved)
        set_rng_state(rng)
        self.batches.replay()
        logger.info(
            f"steps {step + 1}-{done} were trial steps: redone as decided (a measured decision computes "
            "what a recalled one does)"
        )
        return step

    def abandon(self) -> int | None:
        """Let a trial still under way stand as computed when the run ends. Return the trial's
        first step, or None when there is no trial."""
        if self._held is None:
            return None
        step = self._held[0]
        self._held = None
        self.batches.stop()
        return step
