"""Exports that carry a run's exits (``methods=[early_exit]``): one program that stops at an exit.

``ExitModel`` is the trained model cut at its blocks (``fwk.models.exits.segments``) with the
exit heads and the calibrated entropy threshold inside. It computes what evaluation through the
exits does (``fwk.models.exits.exit_logits``): each row (each token of an LM) takes the logits
of the first exit whose softmax entropy is below the threshold, the final output's where none
is. Where it stops is the batched rule: **the batch leaves at an exit when every row of it (every
token) is below the threshold there**, and runs on otherwise. Each decision is a ``torch.cond``,
which ``torch.export`` keeps as a branch of the program: ONNX ``If``, AOTInductor's native
branch. A batch of one leaves where its sample does; a larger batch saves blocks only when all
of its rows are easy, so a server batching requests saves less than the mean depth promises.
Rows are never compacted: a program of fixed-shape kernels, the batch axis one size throughout.

The exits are computed in fp32 with the threshold compared in float64, as calibration compared
them. ONNX, pt2 and aoti exports carry the exits of a run that has them (``--no-exits``: the
plain model); the other formats export the plain model and say so in one line.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fwk.errors import UserError
from fwk.models.exits import NAME, entropy, exit_logits, segments

logger = logging.getLogger(__name__)

RULE = "the batch leaves at an exit when every row (every token) is below the threshold there"
TOLERANCE = 1e-5  # the cut model against the whole one: the same layers, called in the same order


@dataclass(frozen=True)
class Exits:
    """What a run's checkpoint says of its exits."""

    after: list[int]  # the block indices the exits follow
    threshold: float  # nats of softmax entropy
    weights: dict[str, torch.Tensor]  # the heads' weights, under the model's state_dict names


def recorded(run: Any) -> bool:
    """Say whether ``run`` (a RunDir) calibrated exits: its ``summary.json`` has a threshold."""
    try:
        summary = json.loads(run.summary.read_text())
    except (OSError, ValueError):
        return False
    return (summary.get("early_exit") or {}).get("threshold") is not None


def check_onnx_flags(prune: str, quantize: str, qat_steps: int | str) -> None:
    """Refuse, in one line, the ONNX pipeline's stages that cannot take a graph that branches at its exits."""
    why = {
        "--prune": prune != "none" and "removes channels of the blocks the exit heads read",
        "--qat-steps": qat_steps != 0 and "fine-tunes the model without its exit heads",
        f"--quantize {quantize}": quantize in ("int8", "dynamic_int8")
        and "is calibrated on the main graph, and ONNX Runtime's quantizer leaves the exits' If branches in fp32",
    }
    for flag, because in why.items():
        if because:
            raise UserError(
                f"{flag} {because}, with the run's exits in the graph; pass --no-exits to export the model without "
                "them, or drop the flag"
            )


def trained_exits(saved: dict[str, Any], exits: list[int]) -> Exits | None:
    """Return the exits of a checkpoint's state (``state.pt``), or None: the run had no early_exit,
    or it has no threshold yet (calibration runs after the final evaluation). ``exits`` are the
    block indices the run's heads follow."""
    state = (saved.get("methods") or {}).get("early_exit")
    if not state or state.get("threshold") is None:
        return None
    model = saved.get("eval_weights") or saved.get("model") or {}
    weights = {k: v for k, v in model.items() if k.startswith(f"{NAME}.")}
    return Exits(list(exits), float(state["threshold"]), weights)


class ExitModel(nn.Module):
    """The model with its exits as one forward that stops at the first exit its whole batch
    leaves at (see the module's doc). ``parts[i]`` runs up to exit ``i``'s block; ``rest`` runs
    the blocks after the last exit and the model's own head.

    Exported, each part after the first is a ``torch.cond`` on whether the batch has left: run
    the part and its exit, or give zeros of their shapes, which no row reads, since every row
    of a batch that left has taken an earlier exit. The branches are one after another, not
    nested. ``example`` sizes those zeros."""

    def __init__(self, model: nn.Module, threshold: float, example: torch.Tensor) -> None:
        super().__init__()
        heads = getattr(model, NAME)
        cut = segments(model)
        bounds = [-1, *heads.exits]
        self.stem = cut.stem
        self.parts = nn.ModuleList(nn.Sequential(*cut.blocks[a + 1 : b + 1]) for a, b in itertools.pairwise(bounds))
        self.rest = nn.Sequential(*cut.blocks[heads.exits[-1] + 1 :], cut.tail)
        self.heads = heads.heads
        self.lm_head = model.lm_head if heads.kind == "lm" else None  # an LM's exits share its head
        self.after, self.threshold, self.depth = list(heads.exits), float(threshold), heads.depth
        self.kept = 2 if heads.kind == "lm" else 1  # the leading axes a part keeps: (B,) or (B, T)
        with torch.no_grad():
            h, shapes = self.stem(example), []
            for i, part in enumerate(self.parts):
                h = part(h)
                shapes.append((tuple(h.shape[self.kept :]), tuple(self.head(i, h).shape[self.kept :])))
            self.shapes = shapes + [((), tuple(self.rest(h).shape[self.kept :]))]  # each part's output, its exit's

    def head(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """Exit ``i``'s logits from its block's output, in fp32 (``ExitHeads.logits``)."""
        if self.lm_head is None:
            return self.heads[i](h)
        return F.linear(self.heads[i](h.float()), self.lm_head.weight.float())

    def _leaves(self, z: torch.Tensor) -> torch.Tensor:
        return (entropy(z).double() < self.threshold).all()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, outputs = self.stem(x), []
        if not torch.compiler.is_exporting():  # eager (verification, fwk's own timing): a plain branch
            for i, part in enumerate(self.parts):
                h = part(h)
                outputs.append(self.head(i, h))
                if self._leaves(outputs[-1]):
                    return self._first_below(outputs, checked=len(outputs))
            return self._first_below([*outputs, self.rest(h).float()], checked=len(outputs))
        h = self.parts[0](h)
        outputs.append(self.head(0, h))
        left = self._leaves(outputs[0])
        for i in range(1, len(self.parts)):
            h, z = torch.cond(left, functools.partial(self._skip, i), functools.partial(self._part, i), (h,))
            outputs.append(z)
            left = left | self._leaves(z)
        final = torch.cond(left, functools.partial(self._skip, len(self.parts)), self._rest, (h,))[1]
        return self._first_below([*outputs, final], checked=len(outputs))

    def _part(self, i: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.parts[i](h)
        return h, self.head(i, h)

    def _rest(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return h.new_zeros(()), self.rest(h).float()

    def _skip(self, i: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeros of part ``i``'s output and its exit's shapes (the final output's for ``len(parts)``)."""
        lead = tuple(h.shape[: self.kept])
        hidden, logits = self.shapes[i]
        return h.new_zeros(lead + hidden if hidden else ()), h.new_zeros(lead + logits, dtype=torch.float32)

    def _below(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([entropy(z).double() < self.threshold for z in outputs])  # (outputs, B) or (outputs, B, T)

    def _first_below(self, outputs: list[torch.Tensor], checked: int) -> torch.Tensor:
        """Each row's logits from the first of ``outputs[:checked]`` below the threshold, else the last output's."""
        below = self._below(outputs[:checked])
        taken = torch.where(below.any(0), below.int().argmax(0), len(outputs) - 1)
        stacked = torch.stack(outputs)  # (outputs, B, ..., classes)
        index = taken.unsqueeze(0).unsqueeze(-1).expand(1, *stacked.shape[1:])
        return stacked.gather(0, index).squeeze(0)

    @torch.no_grad()
    def stops(self, x: torch.Tensor) -> list[int]:
        """Where each row of ``x``, run alone, leaves the program: its first exit where every token
        (the one sample, for images) is below the threshold, or ``len(exits)``, the end."""
        h, outputs = self.stem(x), []
        for i, part in enumerate(self.parts):
            h = part(h)
            outputs.append(self.head(i, h))
        below = self._below(outputs)
        alone = below.flatten(2).all(-1) if below.dim() > 2 else below  # (exits, B): every token of the row below
        return torch.where(alone.any(0), alone.int().argmax(0), len(outputs)).tolist()

    def alone(self, x: torch.Tensor) -> list[int]:
        """How many rows of ``x``, each run alone, leave at each exit and at the end."""
        return torch.bincount(torch.tensor(self.stops(x)), minlength=len(self.parts) + 1).tolist()

    def describe(self) -> dict[str, Any]:
        """What an export's report says of the exits it carries."""
        return {
            "after_blocks": self.after,
            "blocks": self.depth,
            "threshold": self.threshold,
            "rule": RULE,
        }


@torch.no_grad()
def exit_model(model: nn.Module, threshold: float, example: torch.Tensor) -> ExitModel:
    """Return ``model`` (eval mode, its exit heads attached) as an ``ExitModel``, after checking
    that the cut model computes what evaluation through the exits does on ``example``. A model
    whose forward is not its stem, its blocks and its head in that order is refused in one line."""
    cut = ExitModel(model, threshold, example).eval()
    never = ExitModel(model, -1.0, example).eval()  # no row is ever below: the whole model, through the cut parts
    diff = 0.0
    for x in [example, *example.split(1)]:  # one row at a time too: a batch of one leaves where its row does
        expected, _ = exit_logits(model, x, threshold)
        diff = max(diff, float((never(x) - model(x).float()).abs().max()), float((cut(x) - expected).abs().max()))
    if diff > TOLERANCE:
        raise UserError(
            f"cannot export the exits of this {type(model).__name__}: its blocks, run one after another, differ "
            f"from its forward by {diff:.3g}; pass --no-exits to export the model without them"
        )
    return cut


def attached(model: nn.Module, exits: Exits, example: torch.Tensor) -> nn.Module:
    """Hook the exit heads back into the rebuilt ``model`` and load their trained weights."""
    from fwk.models.exits import attach

    attach(model, exits.after, example)
    missing = set(getattr(model, NAME).state_dict()) ^ {k.removeprefix(f"{NAME}.") for k in exits.weights}
    if missing:
        raise UserError(f"the checkpoint's exit heads do not fit the model: {sorted(missing)[0]}")
    getattr(model, NAME).load_state_dict({k.removeprefix(f"{NAME}."): v for k, v in exits.weights.items()})
    return model


def dropped(without: str) -> None:
    """Say that ``without`` (a format, or --no-exits) exports the plain model of a run that has exits."""
    logger.info(
        f"the run has exit heads (methods=[early_exit]); {without} exports the model without them "
        "(--format onnx, pt2 and aoti carry them, unless --no-exits)"
    )
