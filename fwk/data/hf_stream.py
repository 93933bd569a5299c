"""Training text read as a stream, never all in memory, for ``data=hf data.streaming=true``.

The training texts come through datasets' streaming ``IterableDataset``, with files read as
they are iterated. A ``save_to_disk`` folder comes through ``to_iterable_dataset``. Each epoch
``e`` of rank ``r`` of ``W`` reads, in order:

- the texts, shuffled with datasets' own buffer of ``data.shuffle_buffer`` texts and the file
  order, seeded from the run seed and ``e``: ``shuffle(seed)`` then ``set_epoch(e)``.
- rank ``r``'s share, from ``split_dataset_by_node``. It is whole files when their count
  divides by ``W``, else every ``W``-th text.
- each text, tokenized and ended by the end-of-text id, and opened in one of
  ``data.open_texts`` lanes. Each row of a batch is the next ``seq_len`` tokens of one lane,
  and the token after them is the last one's target. The batch's lanes are drawn at random,
  seeded by the run seed, the epoch and the batch. A drawn lane short of tokens takes the
  epoch's next text. Once the texts run out, rows are drawn from the lanes that still hold a
  window, until fewer than a batch do, and the rest is dropped. A lane holds its texts' token
  ids, 4 bytes each, so memory is about ``open_texts`` texts' worth.

The lanes are there because packing the stream straight into batches fills a batch with the
neighbouring windows of one or two long texts, and the next batches with the same texts. On
hf_llama_stdlib over the stdlib's 825 files, a save_to_disk folder whose validation split is
every 20th file, packed batches trained to a train loss of 3.00 at step 150. The in-memory
set's random windows reached 2.15. With 1,024 open texts, val loss was 1.63, 1.40 and 1.28 at
steps 300, 600 and 900, against 1.77, 1.48 and 1.38 in memory, on a 2-core AMD EPYC.

The texts are read and tokenized in a thread of the training process, a few batches ahead of
the step. Arrow reading and Hugging Face's fast tokenizers run outside the GIL.

The position, after each batch, holds the epoch, the batches drawn, the next text of this
rank's epoch to hand out, whether the texts have run out, and each lane's texts with the
tokens of its first already used. A resumed run reads the epoch again from the lanes' oldest
text, and tokenizes only the lanes' texts and those after them. It goes on with the same
batches as an uninterrupted run. That is the same exact-resume rule as ``data=streaming``, on
the same number of processes. Each rank's position is its own, kept in its own checkpoint
file. On another number of processes the run goes on at the start of the next epoch, since
rank 0's position is all it has. The shuffle buffer is not state, so it is read again from
the epoch's start. A resume costs reading the texts the epoch has used so far, not
tokenizing them.

The val set is the data's own ``validation`` (or ``test``) split of a ``save_to_disk``
folder. Otherwise a text is a val text when a hash of it falls in 1/``val_every``. These are
the same texts on every rank, in any order and any sharding, and a duplicated text is on one
side only. The val set's first ``val_max_tokens`` tokens are read into memory, in file order.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from fwk.data.base import DataBundle
from fwk.data.configs import HFDataConfig
from fwk.data.hf_tokens import Tokenizer, joined, read
from fwk.data.text import ByteWindows
from fwk.errors import UserError

logger = logging.getLogger(__name__)

AHEAD = 4  # batches the reading thread keeps ready
ENCODE = 64  # texts tokenized in one call
SAMPLE_WINDOWS = 64  # windows of the first texts kept in memory: the run's example input, ``fwk data preview``

# {epoch, step, next: the text to hand out, dry, lanes: [lane, text, tokens used, lane, ...] (flat: one object)}
Position = dict[str, Any]
Batch = tuple[torch.Tensor, torch.Tensor]  # (B, T) int64 inputs, targets
Encode = Callable[[list[str]], list[list[int]]]


def is_val(text: str, every: int) -> bool:
    """Return whether a text is a val text of a set without a validation split: 1 in ``every``, by content."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass")) % every == 0


def column(table: Any, cfg: HFDataConfig) -> Any:
    """Return the stream of ``text_column`` alone, without decoding the other columns."""
    names = table.column_names
    if names is None:  # a JSON Lines stream knows its columns once read: peek at the first row
        names = list(next(iter(table), {}))
    if cfg.text_column not in names:
        raise UserError(
            f"data.text_column={cfg.text_column}: the data has no such column; its columns: {', '.join(names)}"
        )
    return table.select_columns([cfg.text_column])


def epoch_texts(
    table: Any, cfg: HFDataConfig, seed: int, rank: int, world_size: int, held_out: bool
) -> Callable[[int], Iterator[str | None]]:
    """Return a function from an epoch to this rank's texts of that epoch, in order.

    With ``held_out``, the val texts are in ``table`` too, since it has no split of its own.
    Each of them comes as None, so that a text's index counts them."""
    from datasets.distributed import split_dataset_by_node

    shuffled = table.shuffle(seed=seed, buffer_size=cfg.shuffle_buffer) if cfg.shuffle_buffer else table
    mine = split_dataset_by_node(shuffled, rank=rank, world_size=world_size) if world_size > 1 else shuffled
    name, every = cfg.text_column, cfg.val_every

    def texts(epoch: int) -> Iterator[str | None]:
        mine.set_epoch(epoch if cfg.shuffle_buffer else 0)  # (datasets reorders the files of epoch > 0)
        for row in mine:
            text = row[name] or ""
            yield None if held_out and is_val(text, every) else text

    return texts


class TextStream:
    """This rank's endless training batches (B, T) of int64 inputs and targets, from ``lanes`` open texts.

    Each row is the next window of one lane. The B lanes of a batch are drawn at random, seeded
    by the run seed, the epoch and the batch, and a lane short of tokens takes the epoch's next
    text. The state is its position, with the world size it was taken on. The position holds
    the epoch, the batches drawn, the next text to hand out, whether the epoch's texts have run
    out, and each lane's texts with the tokens of its first already used."""

    def __init__(
        self,
        texts: Callable[[int], Iterable[str | None]],
        encode: Encode,
        end: list[int],
        seq_len: int,
        batch_size: int,
        lanes: int,
        seed: int,
        world_size: int,
        source: str,
    ) -> None:
        self.texts, self.encode, self.end = texts, encode, end
        self.seq_len, self.batch_size, self.lanes, self.seed = seq_len, batch_size, max(lanes, batch_size), seed
        self.world_size, self.source = world_size, source
        self.pin = False  # batches in pinned memory (loader.pin_memory, with CUDA): copied to the GPU asynchronously
        self.position: Position = _start(0)

    def __iter__(self) -> Iterator[Batch]:
        ready: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=AHEAD)
        stop = threading.Event()
        reader = threading.Thread(target=self._read, args=(ready, stop), name="fwk-hf-stream", daemon=True)
        reader.start()
        try:
            while True:
                kind, item = ready.get()
                if kind == "error":
                    raise item
                batch, self.position = item
                yield batch
        finally:
            stop.set()

    def _read(self, ready: queue.Queue[tuple[str, Any]], stop: threading.Event) -> None:
        try:
            for batch, position in self.batches(self.position):
                item = (tuple(t.pin_memory() for t in batch) if self.pin else batch), position
                while not stop.is_set():
                    try:
                        ready.put(("batch", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as exc:  # handed to the training loop, which raises it
            ready.put(("error", exc))

    def batches(self, start: Position) -> Iterator[tuple[Batch, Position]]:
        """Yield each batch and the position after it, from ``start`` on, epoch after epoch."""
        position = start
        while True:
            got = 0
            for item in self._epoch(position):
                got += 1
                yield item
            if not got and position["step"] == 0:
                raise UserError(
                    f"{self.source}: an epoch of this rank's texts makes too few tokens for one batch of "
                    f"{self.batch_size} x {self.seq_len}; add text or lower train.batch_size or data.seq_len"
                )
            position = _start(position["epoch"] + 1)

    def _epoch(self, at: Position) -> Iterator[tuple[Batch, Position]]:
        epoch, step, handed, dry = at["epoch"], at["step"], at["next"], at["dry"]
        size, rows = self.seq_len + 1, self.batch_size  # a window and its last target
        flat = at["lanes"]
        held = {flat[i + 1]: (flat[i], flat[i + 2]) for i in range(0, len(flat), 3)}
        lanes: list[deque[list[Any]]] = [deque() for _ in range(self.lanes)]  # [index, used, ids left]
        have = [0] * self.lanes
        source = self._tokenized(epoch, min(held, default=handed), handed, held)
        for index, ids in source:  # a resumed epoch: the lanes' texts again, then the texts after them
            if index >= handed:
                source = itertools.chain([(index, ids)], source)
                break
            lane, used = held[index]
            lanes[lane].append([index, used, ids[used:]])
            have[lane] += len(ids) - used

        def fill(lane: int) -> bool:
            """Return whether the lane holds a window, once it has taken texts until it does."""
            nonlocal handed
            while have[lane] < size:
                pulled = next(source, None)
                if pulled is None:
                    return False
                index, ids = pulled
                handed = index + 1
                if len(ids):
                    lanes[lane].append([index, 0, ids])
                    have[lane] += len(ids)
            return True

        while True:
            draw = np.random.default_rng([self.seed, epoch, step])
            chosen = [] if dry else [int(j) for j in draw.choice(self.lanes, rows, replace=False)]
            dry = dry or not all(fill(j) for j in chosen)
            if dry:  # the texts have run out: the lanes that still hold a window, until fewer than B do
                ready = [j for j in range(self.lanes) if have[j] >= size]
                if len(ready) < rows:
                    return
                chosen = [ready[int(k)] for k in draw.choice(len(ready), rows, replace=False)]
            windows = np.stack([_window(lanes[j], size) for j in chosen]).astype(np.int64)
            for j in chosen:
                have[j] -= self.seq_len
            step += 1
            x, y = (torch.from_numpy(np.ascontiguousarray(w)) for w in (windows[:, :-1], windows[:, 1:]))
            # flat ints: a position a batch is not thousands of small lists for the garbage collector to walk
            lanes_at = [n for j, lane in enumerate(lanes) for index, used, _ in lane for n in (j, index, used)]
            yield (x, y), {"epoch": epoch, "step": step, "next": handed, "dry": dry, "lanes": lanes_at}

    def _tokenized(self, epoch: int, start: int, handed: int, held: dict[int, Any]) -> Iterator[tuple[int, np.ndarray]]:
        """Yield the index in the epoch and the ids + end of the texts from ``start`` on that are ``held``.

        The texts not yet ``handed`` out are yielded too. The others, and held-out texts, are
        read and passed over, untokenized."""
        rest = itertools.islice(self.texts(epoch), start, None)
        index = start
        while chunk := list(itertools.islice(rest, ENCODE)):
            wanted = [t if t is not None and (i >= handed or i in held) else None for i, t in enumerate(chunk, index)]
            encoded = iter(self.encode([t for t in wanted if t is not None]))
            for text in wanted:
                if text is not None:
                    yield index, np.asarray(next(encoded) + self.end, dtype=np.int32)
                index += 1

    def state_dict(self) -> Position:
        return {**self.position, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["world_size"]) == self.world_size:
            self.position = {k: state[k] for k in ("epoch", "step", "next", "dry", "lanes")}
            return
        epoch = int(state["epoch"]) + 1
        self.position = _start(epoch)
        logger.info(
            f"data=hf: the checkpoint was taken with {state['world_size']} processes, this run has "
            f"{self.world_size}; resuming at the start of epoch {epoch} (the rest of epoch {epoch - 1} is skipped)"
        )


def _start(epoch: int) -> Position:
    return {"epoch": epoch, "step": 0, "next": 0, "dry": False, "lanes": []}


def _window(lane: deque[list[Any]], size: int) -> np.ndarray:
    """Return the first ``size`` tokens of a lane, which holds as many, and use up all but the last.

    The last is the window's last target, and the next window's first input."""
    parts, got = [], 0
    for _, _, ids in lane:
        parts.append(ids[: size - got])
        got += len(parts[-1])
        if got == size:
            break
    used = size - 1
    while used:
        index, first, ids = lane[0]
        if len(ids) <= used:
            used -= len(ids)
            lane.popleft()
        else:
            lane[0] = [index, first + used, ids[used:]]
            used = 0
    return np.concatenate(parts)


def packed(texts: Iterable[str | None], encode: Encode, end: list[int], cap: int) -> torch.Tensor:
    """Return the first ``cap`` tokens of ``texts``, each ended by ``end``, as one (N,) tensor.

    ``cap`` 0 means all. The texts are tokenized ``ENCODE`` texts a call, and only as far as
    ``cap`` needs."""
    rest = (t for t in texts if t is not None)
    chunks = iter(lambda: list(itertools.islice(rest, ENCODE)), [])
    return joined((ids for chunk in chunks for ids in encode(chunk)), end, cap)


def bundle(cfg: HFDataConfig, seed: int) -> DataBundle:
    """Build the streamed set: its training loader per rank, and in memory its val windows and first windows.

    The first windows are those of its first training texts in file order. They are the run's
    example input, and what ``fwk data preview`` shows."""
    train, own_val = read(cfg, streaming=True)
    train = column(train, cfg)
    tok = Tokenizer(cfg.tokenizer)
    name, every = cfg.text_column, cfg.val_every
    if own_val is not None:
        val_texts: Iterable[str | None] = (row[name] for row in column(own_val, cfg))
    else:
        val_texts = (row[name] for row in train if is_val(row[name] or "", every))
    val = ByteWindows(packed(val_texts, tok.encode, tok.end, cfg.val_max_tokens), cfg.seq_len)
    if len(val) == 0:
        raise UserError(
            f"the val texts make {len(val.data)} tokens, too few for one window of seq_len={cfg.seq_len}; "
            "add text, lower data.val_every or data.seq_len"
        )
    first = (row[name] for row in train if own_val is not None or not is_val(row[name] or "", every))  # file order
    examples = ByteWindows(packed(first, tok.encode, tok.end, SAMPLE_WINDOWS * cfg.seq_len + 1), cfg.seq_len)
    if len(examples) == 0:
        raise UserError(f"the training texts make too few tokens for one window of seq_len={cfg.seq_len}; add text")
    source = f"data.path={cfg.path}"
    logger.info(
        f"data=hf: streaming the training texts of {source} ({tok.name}, vocabulary {tok.vocab}); "
        f"{len(val.data):,} val tokens in memory"
    )

    def loader(batch: int, world: int, kwargs: dict[str, Any], collate: Any, rank: int) -> TextStream:
        del collate  # whole batches, made in a thread of this process
        if kwargs.get("num_workers") and rank == 0:
            logger.info(
                f"data=hf: streamed text is read in a thread of each training process; loader.num_workers="
                f"{kwargs['num_workers']} applies to validation only"
            )
        texts = epoch_texts(train, cfg, seed, rank, world, own_val is None)
        stream = TextStream(texts, tok.encode, tok.end, cfg.seq_len, batch, cfg.open_texts, seed, world, source)
        stream.pin = bool(kwargs.get("pin_memory"))
        return stream

    # in_memory: loader=auto gives no workers to what remains (val windows, in memory)
    return DataBundle(
        train=examples,
        val=val,
        task="lm",
        num_classes=tok.vocab,
        in_memory=True,
        train_loader=loader,
        tokenizer=tok.name,
    )
