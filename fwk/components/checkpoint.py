"""Checkpoints that resume exactly: atomic, checksummed, the last K kept.

Layout of one checkpoint: ``checkpoints/step-00000400/`` holding ``state.pt`` (model,
optimizer, scheduler, data position, step), ``rng-rank<R>.pt`` (every rank's RNG
states and its own data position) and ``manifest.json`` (step, world size, sha256 of
each file). Under FSDP the model and optimizer go to ``sharded/`` instead, written by every rank with
``torch.distributed.checkpoint``, which reshards them when another number of processes
loads them (fwk/distributed/resize.py). It is written into a temp dir, fsynced, then renamed:
a crash leaves the previous checkpoint intact. Files are loaded with
``weights_only=True``: a checkpoint cannot run code.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fwk.components import refused_write
from fwk.components.train_state import rng_state
from fwk.distributed.group import Dist
from fwk.errors import UserError

logger = logging.getLogger(__name__)

_PREFIX = "step-"
_TMP = ".tmp-"  # a checkpoint being written
_ASIDE = ".old-"  # the previous copy of a step being written again


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_SHARDED = "sharded"
# Parts of the state each rank keeps in its own file too. A streamed set's position is the
# rank's own (fwk/data/hf_stream.py), and state.pt holds rank 0's, for another world size.
RANK_OWN = ("loader",)
Template = Callable[[bool], dict[str, Any]]  # (optimizer state flat by name?) -> this rank's state to load into


def model_weights(path: Path) -> dict[str, torch.Tensor]:
    """Load the whole model's weights from a checkpoint dir of either layout, in one process."""
    if (path / _SHARDED).is_dir():
        from fwk.components.dcp_reader import whole

        return whole(path / _SHARDED)["model"]  # data only: DCP's own reader would unpickle anything
    return torch.load(path / "state.pt", map_location="cpu", weights_only=True)["model"]


class RewindPoint:
    """The model's weights early in training, kept for lottery-ticket rewinding (``fwk export``).

    Saved once, at ``rewind_at`` x ``max_steps`` (at least step 1), as whole tensors in
    ``rewind/step-<N>.pt`` beside the checkpoints, never pruned with them. A resumed run
    that has passed that step finds the file and leaves it alone. Cheap: weights only, once.
    """

    def __init__(self, root: Path, dist: Dist, rewind_at: float, max_steps: int) -> None:
        self.root, self.dist = root, dist
        self.step = max(1, round(rewind_at * max_steps)) if rewind_at > 0 else None
        # Decided once, before training, by every rank alike. Under HSDP rank 0 gathers the
        # weights with its shard group only and may write the file before a rank of another
        # replica group reaches the step. That rank must not then skip the barrier below.
        self.done = self.path is None or self.path.exists()

    @property
    def path(self) -> Path | None:
        return self.root / f"{_PREFIX}{self.step:08d}.pt" if self.step is not None else None

    def after(self, step: int, model: torch.nn.Module) -> None:
        """Save when due. Every rank calls it after every step, since gathering sharded weights
        is a collective."""
        if step != self.step or self.done or self.path is None:
            return
        self.done = True
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.dist.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f".tmp-{self.path.name}"
            torch.save({"step": step, "model": weights}, tmp)
            _fsync_file(tmp)
            os.rename(tmp, self.path)
            _fsync_dir(self.root)
        self.dist.barrier()


class Checkpointer:
    def __init__(self, root: Path, dist: Dist, keep: int, on_corrupt: str = "error", sharded: bool = False) -> None:
        self.root, self.dist, self.keep, self.on_corrupt, self.sharded = root, dist, keep, on_corrupt, sharded

    def _final(self, step: int) -> Path:
        return self.root / f"{_PREFIX}{step:08d}"

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Save a checkpoint and return its dir. This is a collective: every rank calls it at
        the same step."""
        final = self._final(step)
        tmp = self.root / f"{_TMP}{final.name}"
        try:
            return self._save(step, state, final, tmp)
        except BaseException as exc:  # DCP's CheckpointException is one; imported, it costs the engine's start-up
            if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                raise
            code = refused_write.cause(exc, tmp if tmp.is_dir() else self.root)  # asked beside the partial files
            if code is None:
                raise
            raise self._refused(final, tmp, code) from None

    def _refused(self, final: Path, tmp: Path, code: int) -> UserError:
        """The one line for a save the file system refused, once the unfinished copy is removed."""
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(self.root).free if self.root.exists() else 0
        last = self.latest()
        kept = f"{last.name} is intact" if last is not None else "there is no earlier checkpoint"
        head = (
            f"no space left on the device of {self.root}"
            if code in (errno.ENOSPC, errno.EDQUOT)
            else f"the file system of {self.root} refused a write"
        )
        why = os.strerror(code) if code else "it accepts writes again now"
        fix = "raise the file-size limit (ulimit -f)" if code == errno.EFBIG else "free some space"
        return UserError(
            f"{head} while saving {final.name} ({why}; {free / 2**20:.0f} MiB free now): the unfinished copy is "
            f"removed and {kept}; {fix}, then run the same command to resume"
        )

    def _save(self, step: int, state: dict[str, Any], final: Path, tmp: Path) -> Path:
        if self.dist.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        self.dist.barrier()
        rng_file = tmp / f"rng-rank{self.dist.rank}.pt"
        torch.save({**rng_state(), **{k: state[k] for k in RANK_OWN if k in state}}, rng_file)
        _fsync_file(rng_file)
        if self.sharded:
            import torch.distributed.checkpoint as dcp

            shards = {key: state.pop(key) for key in ("model", "optimizer")}
            dcp.save(shards, checkpoint_id=tmp / _SHARDED)  # collective: each rank its own shards
            for f in (tmp / _SHARDED).iterdir():
                _fsync_file(f)
        self.dist.barrier()
        if self.dist.is_main:
            torch.save(state, tmp / "state.pt")
            _fsync_file(tmp / "state.pt")
            files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
            manifest = {
                "step": step,
                "world_size": self.dist.world_size,
                "batch_degree": self.dist.batch_degree,  # the data dimension (fwk/distributed/dims.py)
                "layout": self.dist.layout.label(),
                "sharded": self.sharded,
                "optimizer_flat": self.sharded,  # optimizer state keyed by parameter name, each on its own
                "sha256": {f: sha256_file(tmp / f) for f in files},
            }
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            _fsync_file(tmp / "manifest.json")
            _fsync_dir(tmp)
            self._swap_in(tmp, final)
            self._prune()
        self.dist.barrier()
        return final

    def _swap_in(self, tmp: Path, final: Path) -> None:
        """Rename the finished ``tmp`` to ``final``. A re-save of a step (the final one, after a
        stop) moves the old copy aside first and deletes it only once the new one is in place:
        a crash in between leaves ``.old-step-N``, which ``tidy`` puts back."""
        aside = self.root / f"{_ASIDE}{final.name}"
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(final, aside)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        shutil.rmtree(aside, ignore_errors=True)

    def tidy(self) -> list[str]:
        """Repair what a save cut short left behind. Rank 0 calls it before a run looks for its
        checkpoint. An old copy moved aside whose new copy never arrived goes back in place.
        Unfinished copies (``.tmp-step-N``) are removed. Return what was done, one phrase each."""
        done = []
        if not self.root.is_dir():
            return done
        for aside in sorted(self.root.glob(f"{_ASIDE}{_PREFIX}*")):
            final = self.root / aside.name[len(_ASIDE) :]
            if final.exists():
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(aside, final)
                done.append(f"put back {final.name} (its re-save was cut short)")
        for tmp in sorted(self.root.glob(f"{_TMP}*")):
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)
            done.append(f"removed {tmp.name} (a save cut short)")
        if done:
            _fsync_dir(self.root)
        return done

    def _prune(self) -> None:
        for old in self.all()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def keep_only(self, path: Path) -> None:
        """Remove every complete checkpoint but ``path`` (the caller's rank 0 only)."""
        for old in self.all():
            if old != path:
                shutil.rmtree(old, ignore_errors=True)

    def all(self) -> list[Path]:
        """List the complete checkpoints, those with a manifest, oldest first."""
        if not self.root.exists():
            return []
        done = [p for p in self.root.glob(f"{_PREFIX}*") if (p / "manifest.json").exists()]
        return sorted(done, key=lambda p: int(p.name[len(_PREFIX) :]))

    def latest(self) -> Path | None:
        found = self.all()
        return found[-1] if found else None

    def _damage(self, path: Path) -> str | None:
        """Say what is wrong with a checkpoint's files, or return None when every checksum
        holds.

        Every rank checks every file, so all ranks reach the same verdict on a shared disk."""
        try:
            manifest = json.loads((path / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError):
            return "manifest.json unreadable"
        written = manifest.get("world_size")
        sharded = bool(manifest.get("sharded", False))
        # One process's whole tensors shard under FSDP and tensor parallel. A pipeline stage
        # cannot tell which of them are its own from a state keyed by parameter index.
        if self.sharded and not sharded and (written != 1 or self.dist.layout.pp > 1):
            raise UserError(
                f"checkpoint {path} is unsharded (parallel=ddp, or one process) but this run is "
                f"{self.dist.layout.label()}; resume with the parallel setting that wrote it (parallel=ddp)"
            )
        names = ["state.pt", *(f"rng-rank{r}.pt" for r in range(int(written or 0)))]
        if sharded:
            shard_files = [f for f in manifest.get("sha256", {}) if f.startswith(f"{_SHARDED}/")]
            names += shard_files or [f"{_SHARDED}/.metadata"]
        for name in names:
            expected = manifest.get("sha256", {}).get(name)
            if expected is None or not (path / name).exists() or sha256_file(path / name) != expected:
                return f"{name}: missing or checksum mismatch"
        return None

    def load(self, path: Path, template: Template | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Check every checksum, then return the state and this rank's RNG state. The state's
        data position is this rank's own. The RNG state is None when another world size wrote
        it. Then fwk/distributed/resize.py derives the rank's streams, and the position is rank
        0's.

        Sharded: ``template()`` gives this rank's model and optimizer state to load into."""
        damage = self._damage(path)
        if damage is not None:
            hint = f"move {path} out of {self.root} to resume from the checkpoint before it"
            raise UserError(f"checkpoint {path} is corrupt ({damage}); {hint}")
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
        rng_file = path / f"rng-rank{self.dist.rank}.pt"
        manifest = json.loads((path / "manifest.json").read_text())
        written_batches = manifest.get("batch_degree", manifest.get("world_size"))
        same_size = manifest.get("world_size") == self.dist.world_size and written_batches == self.dist.batch_degree
        rng = torch.load(rng_file, map_location="cpu", weights_only=True) if same_size else None
        for key in RANK_OWN if rng is not None else ():
            if key in rng:  # (a checkpoint from before it kept the key per rank has rank 0's only)
                state[key] = rng.pop(key)
        if manifest.get("sharded", False):
            from fwk.components.dcp_reader import load as load_shards

            # this rank's shards, or the whole tensors of a run on one process: resharded as read
            assert template is not None, "a sharded checkpoint loads into the model's own state"
            shards = template(bool(manifest.get("optimizer_flat", False)))
            load_shards(shards, path / _SHARDED)  # data only: DCP's own reader would unpickle anything
            state.update(shards)
        return state, rng

    def load_latest(self, template: Template | None = None) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
        """Load the newest checkpoint that loads and return its path, state and RNG. Return
        None when there is none.

        With ``on_corrupt=fallback`` a damaged newest checkpoint is skipped for the newest
        intact one, with one warning naming both; nothing is deleted. A restarted worker
        (torchrun elastic, SLURM requeue) thus resumes without anyone moving files by hand.
        """
        if self.dist.is_main:
            for done in self.tidy():
                logger.info(f"checkpoints: {done}")
        self.dist.barrier()
        found = self.all()
        if not found or self.on_corrupt == "error":
            return (found[-1], *self.load(found[-1], template)) if found else None
        skipped: list[tuple[Path, str]] = []
        for path in reversed(found):
            damage = self._damage(path)
            if damage is None:
                if skipped:
                    names = ", ".join(f"{p.name} ({why})" for p, why in skipped)
                    logger.warning(f"warning: skipped corrupt checkpoint {names}; resuming from {path.name} instead")
                return (path, *self.load(path, template))
            skipped.append((path, damage))
        raise UserError(
            f"every checkpoint in {self.root} is corrupt (newest: {found[-1].name}, {skipped[0][1]}); "
            f"move {self.root} away to train from scratch"
        )
