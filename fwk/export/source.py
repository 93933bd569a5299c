"""Stage 0: turn a finished run into its config, its newest complete checkpoint and the
eval-mode model.

The model is rebuilt with the engine's own builders from the run's stored config (never
by composing Hydra again), on the CPU in fp32, and its weights come from
``fwk.components.checkpoint.model_weights``, which reads both the plain and the sharded (FSDP)
checkpoint layout. The checkpoint's checksums are checked first: a damaged file is one
line naming it, not a pickle traceback.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fwk.errors import UserError
from fwk.track.lookup import is_complete
from fwk.track.store import RunDir

if TYPE_CHECKING:  # torch is imported by load() only: the checks above it stay fast
    import torch
    from torch import nn

    from fwk.config.schema import Config
    from fwk.data import DataBundle

_STEP = re.compile(r"step-(\d+)$")


@dataclass
class Source:
    run: RunDir
    config: Config
    checkpoint: Path
    step: int
    model: nn.Module  # eval mode, CPU, fp32, the checkpoint's weights
    data: DataBundle
    history: list = field(default_factory=list)  # removals made while training (methods=[prune_gradually])
    exits: dict[str, Any] | None = None  # the exits ``model`` carries (fwk.export.exits), None without


def train_command(run: RunDir) -> str:
    """Return the command line that last launched the run, from meta.json, to tell the user how
    to resume."""
    try:
        argv = json.loads(run.meta.read_text())["launches"][-1]["argv"]
        return "fwk " + " ".join(argv[1:])
    except (OSError, ValueError, KeyError, IndexError):
        return f"fwk train with the config in {run.config}"


def checkpoints(run: RunDir) -> list[Path]:
    """List the complete checkpoints, those with a manifest, oldest first."""
    if not run.checkpoints.is_dir():
        return []
    found = [p for p in run.checkpoints.iterdir() if _STEP.match(p.name) and (p / "manifest.json").is_file()]
    return sorted(found, key=lambda p: int(_STEP.match(p.name).group(1)))  # type: ignore[union-attr]


def check_exportable(run: RunDir) -> Path:
    """Pick the checkpoint of a finished run to export. That is its best one
    (``checkpoint.best``) when it kept one, else its newest complete one. Say in one line what
    is missing otherwise."""
    found = checkpoints(run)
    if not is_complete(run):
        where = f"newest checkpoint: {found[-1].name}" if found else "no checkpoint yet"
        raise UserError(
            f"run {run.id} is not complete (no summary.json; {where}); "
            f"finish it first by running its command again: {train_command(run)}"
        )
    if not found:
        raise UserError(
            f"run {run.id} has no complete checkpoint in {run.checkpoints} (moved or deleted?); "
            f"retrain it: move {run.path} away and run {train_command(run)}"
        )
    from fwk.components.best import read_best

    best = read_best(run.path)
    return best["path"] if best is not None else found[-1]


def _saved_state(checkpoint: Path) -> dict[str, Any]:
    """Read the checkpoint's ``state.pt``, with the methods' and optimizer's state. Return {}
    for a sharded one, which keeps the model apart."""
    import torch

    state = checkpoint / "state.pt"
    return torch.load(state, map_location="cpu", weights_only=True) if state.is_file() else {}


def exported_weights(checkpoint: Path, saved: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the weights to export. They are the moving average's when the run trained with
    methods=[ema], the averaged point's with optim=adamw_schedulefree, since evaluation used
    them too, and else the model's. ``saved`` is the checkpoint's state, when the caller has
    read it already."""
    from fwk.components.checkpoint import model_weights
    from fwk.methods.base import Methods
    from fwk.optim.schedule_free import AveragedPoint

    saved = _saved_state(checkpoint) if saved is None else saved
    averaged = Methods.exported(saved) or AveragedPoint.exported(saved)  # the evaluation-weights protocol
    return averaged if averaged is not None else model_weights(checkpoint)


def _pruned_in_training(model: Any, saved: dict[str, Any], data: Any) -> list:
    """Replay a methods=[prune_gradually] run's removals on the fresh model, which then takes
    the smaller weights. Return the removals, or [] when there are none."""
    from fwk.data.build import example_input
    from fwk.methods.prune_gradually import trained_history
    from fwk.models.pruning import replay

    history = trained_history(saved)
    if history:
        model.eval()
        replay(model, example_input(data), history)
    return history


def _check_checksums(path: Path) -> None:
    """Check that the model's files in the checkpoint match the sha256 its manifest recorded."""
    from fwk.components.checkpoint import sha256_file

    manifest = json.loads((path / "manifest.json").read_text())
    sums: dict[str, str] = manifest.get("sha256", {})
    sharded = bool(manifest.get("sharded", False))
    names = [n for n in sums if n.startswith("sharded/")] if sharded else ["state.pt"]
    for name in names:
        if name not in sums or not (path / name).is_file() or sha256_file(path / name) != sums[name]:
            raise UserError(
                f"checkpoint {path} is damaged ({name}: missing or checksum mismatch); "
                f"move it out of {path.parent} to export the checkpoint before it"
            )


def _with_exits(
    model: Any, run: RunDir, checkpoint: Path, cfg: Config, data: Any, saved: dict[str, Any], carry: bool, without: str
) -> tuple[Any, Any]:
    """Return the model carrying the run's calibrated exits when ``carry``, and what it carries.
    Otherwise return it as it is and, for a run with exits, say that ``without`` (the format or
    flag) leaves them out."""
    if "early_exit" not in cfg.methods:
        return model, None
    from fwk.data.build import example_input
    from fwk.export import capture
    from fwk.export import exits as ex
    from fwk.models.exits import find_blocks

    found = ex.trained_exits(saved, list(cfg.method.early_exit.exits) or find_blocks(model).auto)
    if found is None and carry and ex.recorded(run):
        raise UserError(
            f"checkpoint {checkpoint} was saved before the run calibrated its exits (the best checkpoint of an "
            "earlier step); pass --no-exits to export its model without them"
        )
    if found is None or not carry:
        if found is not None:
            ex.dropped(without)
        return model, None
    ex.attached(model, found, example_input(data)).float().eval()
    carried = ex.exit_model(model, found.threshold, capture.example_input(data.val))
    return carried, carried.describe()


def load(run: RunDir, carry_exits: bool = False, without: str = "this export") -> Source:
    """Rebuild the run's model from its config and load the checkpoint ``check_exportable`` picks.

    For a run trained with exits (``methods=[early_exit]``) the model carries them
    (``fwk.export.exits.ExitModel``) when ``carry_exits``; otherwise one line says that
    ``without`` (a format, or --no-exits) exports the model without them."""
    import torch
    from omegaconf import OmegaConf

    from fwk.config.trust import check_recorded
    from fwk.config.validate import to_typed
    from fwk.data.build import build_data
    from fwk.models.build import build_model

    checkpoint = check_exportable(run)
    recorded = OmegaConf.to_container(OmegaConf.load(run.config), resolve=True)
    check_recorded(recorded, str(run.config))  # before anything of it is built
    cfg = to_typed(recorded)
    torch.manual_seed(cfg.seed)  # the initial weights are replaced by the checkpoint's; the data takes the seed
    data = build_data(cfg.data, seed=cfg.seed)
    model = build_model(cfg.model, data, init=False)
    _check_checksums(checkpoint)
    try:
        saved = _saved_state(checkpoint)
        history = _pruned_in_training(model, saved, data)
        weights = exported_weights(checkpoint, saved)
        model.load_state_dict(weights)
    except RuntimeError as exc:  # shapes or keys differ: the config and the weights disagree
        first = str(exc).strip().splitlines()[0]
        raise UserError(f"checkpoint {checkpoint} does not fit the model of {run.config}: {first}") from None
    step = int(_STEP.match(checkpoint.name).group(1))  # type: ignore[union-attr]
    model, exits = _with_exits(model.float().eval(), run, checkpoint, cfg, data, saved, carry_exits, without)
    return Source(
        run=run, config=cfg, checkpoint=checkpoint, step=step, model=model, data=data, history=history, exits=exits
    )


def training_sample(source: Source, n: int) -> torch.utils.data.Dataset:
    """Draw ``n`` training samples with the run's seed. int8 calibration and Taylor ranking use them."""
    import torch

    order = torch.randperm(len(source.data.train), generator=torch.Generator().manual_seed(source.config.seed))
    return torch.utils.data.Subset(source.data.train, order[:n].tolist())
