"""Exit heads: early outputs read from a model's intermediate blocks (``methods=[early_exit]``).

An exit reads one block's output through a forward hook and maps it to the model's outputs.
On an image model (the small CNN, a torchvision ResNet) it is a global average pool and a
linear layer to the classes. On a GPT it is a copy of the final LayerNorm followed by the
model's own LM head, whose weight is the tied embedding, so an exit adds no head matrix.

The heads are one submodule of the model, ``early_exits``, so the optimizer, DDP and the
checkpoints hold them as any other weight. Their layers are no ``nn.Linear``, so that
``precision.keep_fp32=[last:Linear]`` still names the model's own classifier. An exit's
logits are computed in fp32 for the same reason the recipes keep that classifier in fp32:
they feed a softmax.

The hooks keep a block's output only inside ``capture()``. Plain evaluation, and anything
else that calls the model, keeps nothing and pays one Python call per hooked block.

``exit_logits(model, x, threshold)`` is what an exported exit model computes. Each sample
(each token of an LM) takes the logits of the first exit whose softmax entropy is below
``threshold``, and the final output's when there is none.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fwk.errors import UserError
from fwk.models.loss import CrossEntropy

NAME = "early_exits"  # the heads' attribute on the model, and their prefix in its state_dict


@dataclass
class Blocks:
    """The blocks an exit may follow, in order, and where exits go by default."""

    modules: list[nn.Module]
    auto: list[int]  # the default exits: block indices, never the last block
    kind: str  # "pooled": (B, C, H, W) features to classes; "lm": (B, T, C) hidden states to the vocabulary


def find_blocks(model: nn.Module) -> Blocks:
    """Return the model's blocks: a GPT's transformer blocks, a ResNet's residual blocks, the
    small CNN's conv blocks (each conv with its activation). Any other model is a UserError."""
    if isinstance(getattr(model, "blocks", None), nn.ModuleList) and hasattr(model, "lm_head"):
        n = len(model.blocks)
        quarters = sorted({n * k // 4 - 1 for k in (1, 2, 3)} - {-1, n - 1})  # the ends of each quarter
        return Blocks(list(model.blocks), quarters, "lm")
    stages = [getattr(model, f"layer{i}", None) for i in (1, 2, 3, 4)]
    if all(isinstance(s, nn.Sequential) for s in stages) and hasattr(model, "fc"):  # a torchvision ResNet
        modules = [b for s in stages for b in s]
        ends = [sum(len(s) for s in stages[: i + 1]) - 1 for i in range(3)]  # after each stage but the last
        return Blocks(modules, ends, "pooled")
    features = getattr(model, "features", None)
    if isinstance(features, nn.Sequential):  # the small CNN: a conv block is a Conv2d and its activation
        layers = list(features)
        convs = [i for i, m in enumerate(layers) if isinstance(m, nn.Conv2d)]
        ends = [i + 1 if i + 1 < len(layers) and not isinstance(layers[i + 1], nn.Conv2d) else i for i in convs]
        if convs:
            return Blocks([layers[i] for i in ends], list(range(len(ends) - 1)), "pooled")
    raise UserError(
        f"methods: early_exit places exits on GPT, ResNet and small-CNN models, not {type(model).__name__}; "
        "remove it from methods"
    )


@dataclass
class Segments:
    """A model's forward cut at its blocks: ``tail(blocks[-1](...blocks[0](stem(x))))`` is ``model(x)``.
    The parts are modules that share the model's own layers, for a forward that can stop at an exit."""

    stem: nn.Module  # the input to the first block's input
    blocks: list[nn.Module]  # as ``find_blocks`` counts them: an exit after block i reads blocks[i]'s output
    tail: nn.Module  # the last block's output to the model's output


class _TokenStem(nn.Module):
    """A GPT's input: token and position embeddings, (B, T) ids -> (B, T, C)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.tok_emb, self.pos_emb, self.drop = model.tok_emb, model.pos_emb, model.drop

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)  # (T,)
        return self.drop(self.tok_emb(idx) + self.pos_emb(pos))


def segments(model: nn.Module) -> Segments:
    """Return the model cut at the blocks ``find_blocks`` finds, as the model's own forward runs them
    (the GPT's, torchvision's ResNet's, the small CNN's). ``fwk.export.exits`` checks that the cut
    parts compute what the model does before it exports them."""
    blocks = find_blocks(model)
    if blocks.kind == "lm":
        return Segments(_TokenStem(model), list(model.blocks), nn.Sequential(model.ln_f, model.lm_head))
    if hasattr(model, "layer1"):  # torchvision's ResNet._forward_impl
        stem = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
        return Segments(stem, blocks.modules, nn.Sequential(model.avgpool, nn.Flatten(1), model.fc))
    layers = list(model.features)  # the small CNN: a block runs from after the last block's end to its own
    ends = [next(i for i, m in enumerate(layers) if m is b) for b in blocks.modules]
    starts = [0] + [e + 1 for e in ends[:-1]]
    parts = [nn.Sequential(*layers[a : e + 1]) for a, e in zip(starts, ends, strict=True)]
    return Segments(nn.Sequential(), parts, nn.Sequential(*layers[ends[-1] + 1 :], model.head))


class PooledHead(nn.Module):
    """A global average pool and a linear map to the classes: (B, C, H, W) -> (B, classes)."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        layer = nn.Linear(channels, classes)  # nn.Linear's init; kept as two tensors (see the module's doc)
        self.weight, self.bias = layer.weight, layer.bias

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h.float().mean(dim=(-2, -1)), self.weight.float(), self.bias.float())


class ExitHeads(nn.Module):
    """The exit heads of one model, and the hooks that feed them.

    ``blocks[i]`` for each ``i`` in ``exits`` has a head. For a GPT, ``heads`` holds a
    LayerNorm per exit and the LM head is the model's own. The model is held in a plain list,
    outside the module tree, so its weights are not the heads' too."""

    def __init__(self, model: nn.Module, blocks: Blocks, exits: list[int], heads: nn.ModuleList) -> None:
        super().__init__()
        self.exits, self.depth, self.kind = list(exits), len(blocks.modules), blocks.kind
        self.heads = heads
        self._model = [model]  # not a submodule: the heads' state_dict holds only their own weights
        self.capturing = False
        self.features: list[torch.Tensor | None] = [None] * len(exits)
        self._hooks = [blocks.modules[b].register_forward_hook(self._keep(i)) for i, b in enumerate(exits)]

    def _keep(self, i: int) -> Any:
        def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
            if self.capturing:
                self.features[i] = output

        return hook

    @contextmanager
    def capture(self) -> Iterator[list[torch.Tensor | None]]:
        """Keep the hooked blocks' outputs of the forwards run inside, and let them go after."""
        self.capturing, self.features = True, [None] * len(self.exits)
        try:
            yield self.features
        finally:
            self.capturing, self.features = False, [None] * len(self.exits)

    def logits(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """Return exit ``i``'s logits from its block's output ``h``, in fp32."""
        with torch.autocast(h.device.type, enabled=False):
            if self.kind == "pooled":
                return self.heads[i](h)  # (B, classes)
            head = self._model[0].lm_head.weight
            return F.linear(self.heads[i](h.float()), head.float())  # (B, T, C) -> (B, T, vocab)

    def fused_loss(self, i: int, h: torch.Tensor, y: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        """Return exit ``i``'s mean cross-entropy through the GPT's own head loss (the chunked kernel
        under kernels=triton), which never holds the whole logits tensor."""
        model = self._model[0]
        hidden = self.heads[i](h).flatten(0, 1)  # (B, T, C) -> (B*T, C)
        return model.head_loss(hidden, model.lm_head.weight, y.flatten(), label_smoothing)

    def block_share(self) -> list[float]:
        """Return the share of the blocks run to reach each exit, then 1.0 for the final output."""
        return [(b + 1) / self.depth for b in self.exits] + [1.0]


def attach(model: nn.Module, exits: list[int], example: torch.Tensor | None) -> ExitHeads:
    """Build the heads for ``exits`` (block indices; empty: the defaults), hook them into the
    model and make them its ``early_exits`` submodule. ``example`` is one input of batch size 1,
    which a pooled head's channel count is read from (in eval mode: BatchNorm's statistics stay)."""
    blocks = find_blocks(model)
    exits = list(exits) or blocks.auto
    if not exits:
        raise UserError(
            f"methods: early_exit found {len(blocks.modules)} block(s) in {type(model).__name__}, too few to place "
            "an exit before the last; remove it from methods"
        )
    if exits[-1] >= len(blocks.modules) - 1:
        raise UserError(
            f"method.early_exit.exits={exits} is not allowed: expected block indices below "
            f"{len(blocks.modules) - 1} ({type(model).__name__} has {len(blocks.modules)} blocks and the last is "
            "the model's own output)"
        )
    device = next(model.parameters()).device
    if blocks.kind == "lm":
        heads = nn.ModuleList(copy.deepcopy(model.ln_f) for _ in exits)
    else:
        channels, classes = _shapes(model, [blocks.modules[b] for b in exits], example, device)
        heads = nn.ModuleList(PooledHead(c, classes) for c in channels)
    heads = heads.to(device)
    exit_heads = ExitHeads(model, blocks, exits, heads)
    setattr(model, NAME, exit_heads)
    return exit_heads


@torch.no_grad()
def _shapes(model: nn.Module, modules: list[nn.Module], example: Any, device: torch.device) -> tuple[list[int], int]:
    """Return the channel count of each module's output and the model's class count, from one
    forward of ``example`` in eval mode (BatchNorm's running statistics stay as they are)."""
    if example is None:
        raise UserError("methods: early_exit needs an example input to size its heads; remove it from methods")
    seen: dict[int, int] = {}

    def keep(i: int) -> Any:
        def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
            seen.setdefault(i, int(output.shape[1]))  # (B, C, H, W)

        return hook

    hooks = [m.register_forward_hook(keep(i)) for i, m in enumerate(modules)]
    was = model.training
    model.eval()
    try:
        classes = int(model(example.to(device)).shape[-1])  # (1, classes)
    finally:
        model.train(was)
        for h in hooks:
            h.remove()
    return [seen[i] for i in range(len(modules))], classes


def exit_heads(model: nn.Module) -> ExitHeads:
    """Return the model's exit heads (``attach`` made them)."""
    return getattr(model, NAME)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Return the softmax entropy of each row of logits, in nats: (..., classes) -> (...)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def exit_outputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Return each exit's logits, then the final output's, for input ``x``: (B, classes) or (B, T, vocab)."""
    heads = exit_heads(model)
    with heads.capture() as features:
        final = model(x)
        outputs = [heads.logits(i, h) for i, h in enumerate(features)]
    return [*outputs, final.float()]


def exit_logits(model: nn.Module, x: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return each sample's logits from the first exit whose softmax entropy is below ``threshold``
    (the final output's where none is), and the exit each took (``len(exits)``: the final).

    Every exit is computed, since one batched forward cannot stop per sample. A runtime that
    runs one sample can stop at its exit; the mean depth ``early_exit`` records is that saving.
    """
    outputs = exit_outputs(model, x)
    n = len(outputs) - 1
    # in float64, as calibration compares: its threshold may lie just above an fp32 entropy
    below = torch.stack([entropy(z).double() < threshold for z in outputs[:-1]])  # (exits, B) or (exits, B, T)
    taken = torch.where(below.any(0), below.int().argmax(0), n)  # argmax: the first exit that is below
    stacked = torch.stack(outputs)  # (exits + 1, B, ..., classes)
    index = taken.unsqueeze(0).unsqueeze(-1).expand(1, *stacked.shape[1:])
    return stacked.gather(0, index).squeeze(0), taken


@dataclass(frozen=True)
class ExitLoss(CrossEntropy):
    """The step's loss with exits: sum_i w_i * CE(exit i) + 1.0 * CE(final), divided by
    sum_i w_i + 1.0, so that it stays on the scale of one cross-entropy.

    It is a ``CrossEntropy``, so a later method's ``dataclasses.replace`` (label smoothing)
    keeps the exits. With ``fused`` the final and the exits go through the GPT's head loss."""

    heads: Any = field(default=None, compare=False)  # ExitHeads
    weights: tuple[float, ...] = ()

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.heads.capture() as features:
            final = super().__call__(model, x, y)
            if self.fused:
                losses = [self.heads.fused_loss(i, h, y, self.label_smoothing) for i, h in enumerate(features)]
            else:
                losses = [self._cross_entropy(self.heads.logits(i, h), y) for i, h in enumerate(features)]
        total = final + sum(w * loss for w, loss in zip(self.weights, losses, strict=True))
        return total / (sum(self.weights) + 1.0)

    def _cross_entropy(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), label_smoothing=self.label_smoothing)
