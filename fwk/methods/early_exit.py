"""``early_exit``: dynamic depth. Exit heads after chosen blocks give a prediction early; at
inference a sample leaves at the first exit whose softmax entropy is at most a threshold, so
easy samples run a shallow part of the model and hard ones all of it.

- **Where.** ``method.early_exit.exits`` lists block indices, counted from 0, after which an
  exit reads the hidden state (a forward hook on the block). The blocks are a ResNet's stages
  (``layer1..layer4``), the small CNN's conv blocks (each conv's ReLU), a GPT's transformer
  blocks. Empty (the default): after every stage but the last of a ResNet, after the CNN's
  first conv block, at every quarter of a GPT's layers; never after the last block, whose
  output is the model's own.
- **Heads.** Images: global average pooling and a Linear to the classes. GPT: a LayerNorm of
  its own (started from the final norm's weights) and the model's *shared* LM head, so an exit
  adds ``2 x n_embd`` parameters, not a vocabulary matrix. The heads are a submodule of the
  model (``exit_heads``), added before any strategy wraps it and before the optimizer is built,
  so DDP, the optimizer and the checkpoint hold them: a resumed run continues exactly.
- **Training.** The step's loss is ``(sum_k w_k CE_k + w_final CE_final) / (sum_k w_k + w_final)``,
  with ``method.early_exit.weights`` (default rising with depth: ``(k+1)/(n+1)`` for exit k of
  n) and ``w_final = 1``.
- **Calibration.** After the last evaluation, on the validation split
  (``fwk.engine.exit_calibration``): the largest entropy threshold whose accuracy stays within
  ``max_drop`` of the full model's (for language models: whose mean loss rises by at most
  ``max_drop`` nats). ``summary.json``'s ``early_exit`` holds it with each exit's own accuracy,
  the share of samples leaving at each exit and the mean depth (the share of blocks run).
- **Export.** ``fwk export`` takes the model without its exit heads (``exported``), so every
  format gets the plain model; the exits do not reach the exported programs yet.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fwk.config.methods import Config, Rule
from fwk.distributed.dims import shards_model
from fwk.errors import UserError
from fwk.methods.base import Method, method
from fwk.registry import doc

if TYPE_CHECKING:
    import torch
    from torch import nn

logger = logging.getLogger(__name__)

HEADS = "exit_heads"  # the model's submodule holding the heads (its state_dict keys' prefix)


@dataclass
class EarlyExitConfig:
    """Exit heads after chosen blocks, trained jointly, with an entropy threshold calibrated after training."""

    exits: list[int] = doc(
        [], "block indices (from 0) an exit follows; empty: each ResNet stage, CNN block 0, GPT quarters"
    )
    weights: list[float] = doc([], "loss weight of each exit (the final output weighs 1); empty: (k+1)/(n+1)")
    max_drop: float = doc(
        0.01, "calibration: accuracy the exits may lose against the full model (language models: nats of loss)"
    )

    def rules(self, c: Config) -> Iterator[Rule]:
        p = "method.early_exit"
        yield all(k >= 0 for k in self.exits), f"{p}.exits", list(self.exits), "block indices >= 0"
        yield len(set(self.exits)) == len(self.exits), f"{p}.exits", list(self.exits), "each block once"
        yield self.max_drop >= 0, f"{p}.max_drop", self.max_drop, "a number >= 0"
        yield all(w > 0 for w in self.weights), f"{p}.weights", list(self.weights), "numbers > 0"
        if self.weights and self.exits:
            yield len(self.weights) == len(self.exits), f"{p}.weights", list(self.weights), "one weight per exit"
        if "early_exit" in c.methods:
            yield (
                not shards_model(c),
                "methods",
                list(c.methods),
                "no early_exit with sharded or split models (fsdp/hsdp/tp/pp): the exits read whole blocks; "
                "use parallel=ddp",
            )


def blocks(model: nn.Module) -> list[nn.Module]:
    """Return the blocks an exit may follow, in order, or raise a one-line UserError."""
    from torch import nn

    if all(hasattr(model, f"layer{i}") for i in range(1, 5)):  # torchvision's ResNets
        return [getattr(model, f"layer{i}") for i in range(1, 5)]
    if isinstance(getattr(model, "blocks", None), nn.ModuleList):  # fwk's GPT
        return list(model.blocks)
    features = getattr(model, "features", None)
    if isinstance(features, nn.Sequential):  # the small CNN: each conv's activation ends a block
        return [m for prev, m in zip(features, list(features)[1:], strict=False) if isinstance(prev, nn.Conv2d)]
    raise UserError(
        f"methods: early_exit finds no blocks in {type(model).__name__} (it knows ResNets, the small CNN and "
        "fwk's GPT); remove early_exit from methods"
    )


def default_exits(model: nn.Module, n: int) -> list[int]:
    """The exits of an empty ``method.early_exit.exits``: see the module's doc."""
    if hasattr(model, "layer1"):
        return list(range(n - 1))
    if hasattr(model, "features"):
        return [0] if n > 1 else []
    return sorted({n * q // 4 - 1 for q in (1, 2, 3)} - {-1, n - 1})


@method(EarlyExitConfig)
class EarlyExit(Method):
    name = "early_exit"

    def prepare(self, model: nn.Module) -> None:
        from torch import nn

        if hasattr(model, HEADS):
            raise UserError("methods: early_exit is listed twice; list it once")
        found = blocks(model)
        n = len(found)
        self.exits = list(self.cfg.exits) or default_exits(model, n)
        if not self.exits:
            raise UserError(f"methods: early_exit needs a model of 2 or more blocks; this one has {n}")
        if max(self.exits) >= n - 1:
            raise UserError(
                f"method.early_exit.exits={list(self.cfg.exits)}: this model has blocks 0..{n - 1}, and an exit "
                f"after the last one would be the model's own output; use indices 0..{n - 2}"
            )
        k = len(self.exits)
        self.weights = list(self.cfg.weights) or [(i + 1) / (k + 1) for i in range(k)]
        self.depths = [(e + 1) / n for e in self.exits]  # the share of blocks run to reach each exit
        self.model, self.lm = model, hasattr(model, "lm_head")
        self.taps: dict[int, Any] = {}
        for i, e in enumerate(self.exits):
            found[e].register_forward_hook(lambda _m, _in, out, i=i: self.taps.__setitem__(i, out))
        if self.lm:  # a copy of the final norm per exit; the LM head is the model's own
            heads = [copy.deepcopy(model.ln_f) for _ in self.exits]
        else:
            widths, classes = self._shapes(model)
            device = next(model.parameters()).device
            heads = [
                nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)).to(device) for c in widths
            ]
        setattr(model, HEADS, nn.ModuleList(heads))

    def _shapes(self, model: nn.Module) -> tuple[list[int], int]:
        """Run the example once: return the channels at each exit and the number of classes."""
        import torch

        assert self.example is not None, "Methods.prepare sets the example first"
        was = model.training
        model.eval()
        with torch.no_grad():
            out = model(self.example.to(next(model.parameters()).device))
        model.train(was)
        return [int(self.taps[i].shape[1]) for i in range(len(self.exits))], int(out.shape[-1])

    def exit_logits(self) -> list[torch.Tensor]:
        """Return each exit's logits for the forward that ran last: (N, classes), or (B, T, vocab)."""
        import torch.nn.functional as F

        heads = getattr(self.model, HEADS)
        if self.lm:
            weight = self.model.lm_head.weight
            return [F.linear(heads[i](self.taps[i]), weight) for i in range(len(self.exits))]
        return [heads[i](self.taps[i]) for i in range(len(self.exits))]

    def loss(self, loss: Any) -> Any:
        if loss.fused:
            raise UserError(
                "methods: early_exit reads the logits, which the fused head loss never makes; "
                "set kernels=torch, or remove early_exit"
            )
        from fwk.models.loss import CrossEntropy, ExitLoss

        return ExitLoss(**{f.name: getattr(loss, f.name) for f in dataclasses.fields(CrossEntropy)}, exits=self)

    def finished(self, model: nn.Module, val: Any, precision: Any, task: str, dist: Any, max_batches: int) -> Any:
        """Calibrate the threshold on the validation split; return what summary.json keeps."""
        from fwk.engine.exit_calibration import calibrate, collect

        entropies, scores, final = collect(self, model, val, precision, task, dist, max_batches)
        result = calibrate(entropies, scores, final, task, self.cfg.max_drop, self.depths)
        self.threshold = result["threshold"]
        what = "loss" if task == "lm" else "accuracy"
        if self.threshold is None:
            logger.info(f"early_exit: no threshold keeps the {what} within max_drop {self.cfg.max_drop:g}; exits off")
            return result
        logger.info(
            f"early_exit: threshold {result['threshold']:.4g} (entropy, nats): {what} {result['with_exits']:.4f} "
            f"with exits vs {result['full']:.4f} full (max_drop {self.cfg.max_drop:g}); leaving at exits "
            + ", ".join(f"{s:.0%}" for s in result["share"])
            + f"; mean depth {result['mean_depth']:.2f}"
        )
        return result

    @classmethod
    def exported(cls, state: dict[str, Any]) -> dict[str, Any] | None:
        """Return the model's weights without the exit heads, when the run trained with exits."""
        if cls.name not in (state.get("methods") or {}):
            return None
        return {k: v for k, v in state["model"].items() if not k.startswith(f"{HEADS}.")}

    def describe(self) -> str:
        pairs = ", ".join(f"after block {e} (weight {w:.2g})" for e, w in zip(self.exits, self.weights, strict=True))
        return f"early_exit: exits {pairs}; the final output weighs 1; threshold calibrated after training"

    def state_dict(self) -> dict[str, Any]:
        return {"exits": list(self.exits)}  # the heads are the model's; kept so exports can tell the run had exits

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state.get("exits", self.exits)) != list(self.exits):
            raise UserError(
                f"the checkpoint's exits {state['exits']} differ from this run's {self.exits}; "
                "resume with the same method.early_exit.exits"
            )
