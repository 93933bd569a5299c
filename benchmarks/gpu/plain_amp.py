"""The plain PyTorch loops a user would write with AMP, to time ``fwk train`` against as
whole processes (benchmarks/gpu/whole.py passes every value from the recipe's composed config).

- resnet50: torchvision's ResNet-50 (random init), fwk's synthetic images (the same items:
  ``fwk.data.synthetic.RandomImages``), SGD + Nesterov with weight decay on weights with
  dim >= 2, linear warmup then cosine, label smoothing. On CUDA as NVIDIA's performance guide
  has it: bf16 autocast, channels_last model and input, cudnn.benchmark, loader workers
  (the cores minus one) with pinned memory and non-blocking copies.
- gpt: fwk's GPT class (fwk/models/gpt.py), the standard library's bytes split as
  fwk/data/text.py splits them, AdamW with decay on dim >= 2, warmup then cosine to
  min_lr_ratio, label smoothing, gradient clipping, bf16 autocast on CUDA; in-memory data, no workers.

Both evaluate on the whole validation set every ``--eval-every`` steps and at the end, print
the loss every ``--log-every`` steps (a sync, as a user's log line is), save the model and
optimizer at the end, and print one JSON line last. The optimizers are PyTorch's defaults
(foreach), not the fused ones.

    python -m benchmarks.gpu.plain_amp {resnet50,gpt} --device cuda --amp bf16 --steps 100 ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def lr_factor(warmup: int, max_steps: int, min_ratio: float) -> Callable[[int], float]:
    """Linear warmup to the peak lr, then cosine decay to min_ratio x the peak."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and conv kernels only; biases and norm scales are not decayed."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def endless(loader: DataLoader) -> Iterator:
    while True:
        yield from loader


def loader_kwargs(workers: int, cuda: bool) -> dict:
    kwargs: dict = {"num_workers": workers, "pin_memory": cuda}
    return {**kwargs, "persistent_workers": True} if workers else kwargs


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, to_input: Callable, device: torch.device, amp: bool) -> float:
    """Mean cross-entropy per target (image or token) over the whole loader."""
    model.eval()
    loss_sum, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for x, y in loader:
        x, y = to_input(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x)
        target = y.reshape(-1)
        loss_sum += F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target, reduction="sum").double()
        count += target.numel()
    model.train()
    return loss_sum.item() / max(count, 1)


def train(
    args: argparse.Namespace,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Loss,
    data: tuple[Dataset, Dataset],
    workers: int,
    to_input: Callable[[torch.Tensor], torch.Tensor],
) -> dict:
    """The loop: ``args.steps`` optimizer steps over shuffled epochs; returns the last figures."""
    device, amp = torch.device(args.device), args.amp == "bf16"
    cuda = device.type == "cuda"
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_factor(args.warmup_steps, args.steps, args.min_lr_ratio)
    )
    shuffle = torch.Generator().manual_seed(args.seed)
    kwargs = loader_kwargs(workers, cuda)
    train_loader = DataLoader(data[0], args.batch_size, shuffle=True, drop_last=True, generator=shuffle, **kwargs)
    val_loader = DataLoader(data[1], args.batch_size, shuffle=False, **kwargs)
    batches = endless(train_loader)
    model.train()
    loss, val_loss = torch.zeros(()), float("nan")
    for step in range(1, args.steps + 1):
        x, y = next(batches)
        x, y = to_input(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model, x, y)
        loss.backward()
        if args.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if step % args.log_every == 0 or step == args.steps:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)  # note: a CPU-GPU sync point
        if (args.eval_every and step % args.eval_every == 0) or step == args.steps:
            val_loss = evaluate(model, val_loader, to_input, device, amp)
            print(f"step {step}: val_loss {val_loss:.4f}", flush=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": args.steps}, args.out)
    return {"steps": args.steps, "loss": loss.item(), "val_loss": val_loss, "amp": args.amp, "workers": workers}


def resnet50(args: argparse.Namespace) -> dict:
    import torchvision.models as tvm

    from fwk.data.synthetic import RandomImages

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = cuda  # one input shape throughout: let cuDNN pick its fastest convs
    torch.manual_seed(args.seed)
    model = tvm.resnet50(weights=None, num_classes=args.num_classes, zero_init_residual=args.zero_init_residual)
    model = model.to(device)
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=layout)
    optimizer = torch.optim.SGD(
        param_groups(model, args.weight_decay), lr=args.lr, momentum=args.momentum, nesterov=args.nesterov
    )
    data = tuple(
        RandomImages(n, args.image_size, args.num_classes, seed=args.seed, stream=stream)
        for n, stream in ((args.num_train, 0), (args.num_val, 1))  # fwk's stream ids: train 0, val 1
    )
    workers = max(1, len(os.sched_getaffinity(0)) - 1) if cuda else 0  # on a CPU its cores train the model

    def loss_fn(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(net(x).float(), y, label_smoothing=args.label_smoothing)

    def to_input(x: torch.Tensor) -> torch.Tensor:  # (B, 3, S, S), NHWC in memory when channels_last
        return x.contiguous(memory_format=layout)

    return {**train(args, model, optimizer, loss_fn, data, workers, to_input), "channels_last": args.channels_last}


def gpt(args: argparse.Namespace) -> dict:
    from fwk.data.sources import source_files, stdlib_root
    from fwk.data.text import ByteWindows, concat_bytes, split_files
    from fwk.models.gpt import GPT

    device = torch.device(args.device)
    train_files, val_files = split_files(source_files(stdlib_root()), args.val_every)
    data = (
        ByteWindows(concat_bytes(train_files, args.max_bytes), args.seq_len),
        ByteWindows(concat_bytes(val_files, args.val_max_bytes), args.seq_len),
    )
    torch.manual_seed(args.seed)
    model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd, args.dropout, args.bias)
    model = model.to(device)
    optimizer = torch.optim.AdamW(
        param_groups(model, args.weight_decay), lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps
    )

    def loss_fn(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return net(x, y, args.label_smoothing)  # (B, T) ids and targets -> the mean cross-entropy per token

    return train(args, model, optimizer, loss_fn, data, 0, lambda x: x)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    need = {"required": True}
    common.add_argument("--device", choices=["cuda", "cpu"], **need)
    common.add_argument("--amp", choices=["bf16", "off"], **need, help="bf16 autocast, or fp32 throughout")
    common.add_argument("--steps", type=int, **need)
    common.add_argument("--batch-size", type=int, **need)
    common.add_argument("--seed", type=int, **need)
    common.add_argument("--lr", type=float, **need, help="peak learning rate")
    common.add_argument("--weight-decay", type=float, **need)
    common.add_argument("--warmup-steps", type=int, **need)
    common.add_argument("--min-lr-ratio", type=float, **need)
    common.add_argument("--label-smoothing", type=float, **need)
    common.add_argument("--grad-clip", type=float, **need, help="global norm; 0 = off")
    common.add_argument("--eval-every", type=int, **need, help="0 = only at the end")
    common.add_argument("--log-every", type=int, **need)
    common.add_argument("--out", **need, help="where the final model and optimizer state go")
    sub = top.add_subparsers(dest="workload", required=True)
    res = sub.add_parser("resnet50", parents=[common])
    for name in ("image-size", "num-classes", "num-train", "num-val"):
        res.add_argument(f"--{name}", type=int, **need)
    res.add_argument("--momentum", type=float, **need)
    for name in ("nesterov", "zero-init-residual", "channels-last"):
        res.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, **need)
    lm = sub.add_parser("gpt", parents=[common])
    for name in ("vocab-size", "block-size", "n-layer", "n-head", "n-embd", "seq-len", "val-every"):
        lm.add_argument(f"--{name}", type=int, **need)
    lm.add_argument("--max-bytes", type=int, **need, help="cap on train bytes; 0 = all")
    lm.add_argument("--val-max-bytes", type=int, **need, help="cap on val bytes; 0 = all")
    for name in ("dropout", "beta1", "beta2", "eps"):
        lm.add_argument(f"--{name}", type=float, **need)
    lm.add_argument("--bias", action=argparse.BooleanOptionalAction, **need)
    return top


def main() -> None:
    args = parser().parse_args()
    result = resnet50(args) if args.workload == "resnet50" else gpt(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
