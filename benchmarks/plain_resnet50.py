"""The plain PyTorch ResNet-50 loop a careful user writes for an ImageNet-layout folder, as a
process: side (a) of ``benchmarks/resnet50.py``.

    .venv/bin/python -m benchmarks.plain_resnet50 FOLDER

It follows torchvision's reference classification script (references/classification/
train.py): ``torchvision.datasets.ImageFolder`` with v2 transforms (RandomResizedCrop,
flip, to float, normalize; validation: resize the shorter side, center crop), a
``DataLoader`` with ``num_workers`` worker processes and ``pin_memory=True`` (the script's
``-j``; its default 16 where the machine has 16 cores, the machine's cores where it has
fewer), torchvision's ``resnet50(num_classes=...)``, SGD with Nesterov momentum (weight decay
on every parameter, the script's default), label smoothing, and a linear warm-up then a
cosine over the run's steps. fp32 eager, channels-first; ``amp: "bf16"`` trains under
``torch.autocast`` (a GPU user's plain loop).

FOLDER/spec.json (``resnet50.plain_spec`` writes it): ``root``, ``image_size``,
``val_resize``, ``min_scale``, ``num_classes``, ``zero_init_residual``, ``batch_size``,
``lr``, ``momentum``, ``weight_decay``, ``warmup_steps``, ``min_lr_ratio``, ``max_steps``,
``eval_every``, ``label_smoothing``, ``workers``, ``seed``, ``device``, ``amp``,
``metric``, ``target``.

It writes FOLDER/summary.json as ``benchmarks/plain_loop.py`` does (``sides._outcome``
reads it): ``first_step_at`` and ``target.at`` (Unix times), ``target.train_time_s``,
``final_step`` and the last ``eval``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from benchmarks.plain_parts import evaluate, recompute_bn, schedule

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def loaders(spec: dict) -> tuple[DataLoader, DataLoader]:
    size, pin = spec["image_size"], spec["device"] == "cuda"
    to_float = [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    train_tf = v2.Compose(
        [v2.RandomResizedCrop(size, scale=(spec["min_scale"], 1.0), antialias=True), v2.RandomHorizontalFlip(),
         *to_float]
    )  # fmt: skip
    val_tf = v2.Compose([v2.Resize(spec["val_resize"], antialias=True), v2.CenterCrop(size), *to_float])
    root = Path(spec["root"])
    train = torchvision.datasets.ImageFolder(str(root / "train"), transform=train_tf)
    val = torchvision.datasets.ImageFolder(str(root / "val"), transform=val_tf)
    workers, batch = spec["workers"], spec["batch_size"]
    return (
        DataLoader(train, batch, shuffle=True, num_workers=workers, pin_memory=pin, drop_last=True),
        DataLoader(val, batch, shuffle=False, num_workers=workers, pin_memory=pin),
    )


def main(folder: Path) -> None:
    spec = json.loads((folder / "spec.json").read_text())
    metric, target, device, amp = spec["metric"], spec["target"], spec["device"], spec.get("amp")
    torch.manual_seed(spec["seed"])
    if device == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes: the reference's --use-deterministic-algorithms off
    train, val = loaders(spec)
    model = torchvision.models.resnet50(
        num_classes=spec["num_classes"], zero_init_residual=spec["zero_init_residual"]
    ).to(device)
    opt = torch.optim.SGD(
        model.parameters(), lr=spec["lr"], momentum=spec["momentum"], nesterov=True, weight_decay=spec["weight_decay"]
    )
    sched = schedule(opt, spec["warmup_steps"], spec["min_lr_ratio"], spec["max_steps"])
    reached = lambda row: row[metric] >= target if metric == "val_acc" else row[metric] <= target  # noqa: E731
    step, trained, first, hit, last = 0, 0.0, None, None, {}
    while step < spec["max_steps"] and hit is None:
        for x, y in train:
            first = first or time.time()
            t0 = time.perf_counter()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device, torch.bfloat16, enabled=amp == "bf16"):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y, label_smoothing=spec["label_smoothing"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if device == "cuda":
                torch.cuda.synchronize()
            trained += time.perf_counter() - t0
            if step % spec["eval_every"] == 0 or step == spec["max_steps"]:
                recompute_bn(model, train, spec.get("bn_recompute", 0), device)  # 0: the running statistics
                last = evaluate(model, val, 0, device, amp)
                print(f"step {step}: {last} ({trained:.1f} s training)", flush=True)
                if reached(last):
                    hit = {"reached": True, "step": step, "train_time_s": trained, "at": time.time()}
                    break
            if step == spec["max_steps"]:
                break
    summary = {"first_step_at": first, "final_step": step, "eval": last, "target": hit or {"reached": False}}
    if device == "cuda":  # as fwk's summary: the peak allocated device memory
        summary["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    (folder / "summary.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
