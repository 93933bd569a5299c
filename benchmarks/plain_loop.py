"""The plain PyTorch loop a careful user writes, as a process: the benchmarks' other side.

    .venv/bin/python -m benchmarks.plain_loop FOLDER

FOLDER/spec.json says what to train (``sides.plain_side`` writes it):

- ``model``, ``data``: the config sections of the recipe (the user's own model and data
  code: fwk's model and data builders, so that both sides train the same network on the
  same split);
- ``optim``: ``{"name": "adamw"|"sgd", "lr", "weight_decay", "beta1", "beta2", "momentum",
  "nesterov"}``; weight decay on matrices and kernels only, as a careful user groups them;
- ``schedule``: ``{"warmup_steps", "min_lr_ratio", "steps"}``: linear warm-up, then a cosine
  to ``min_lr_ratio`` at ``steps`` (a tuned loop sets its own length), flat after;
- ``seed``, ``batch_size``, ``max_steps``, ``eval_every``, ``eval_batches``, ``grad_clip``,
  ``label_smoothing``, ``device``;
- ``amp``: "bf16" trains under ``torch.autocast`` (a GPU user's plain loop), null is fp32;
- ``bn_recompute``: before each evaluation, the BatchNorm statistics recomputed on that many
  training batches (the evaluation a fast recipe uses), 0: the running statistics;
- ``metric``, ``target``: the evaluation that reaches it ends the run;
- ``record``: also write the rows (``metrics.jsonl``, ``config.yaml``) for ``fwk runs plot``.

It writes FOLDER/summary.json as fwk's worker does: ``first_step_at`` and ``target.at``
(Unix times), ``startup`` (the seconds of its phases: imports, data, model, optimizer, other),
``startup_memory_mib`` (the resident memory each phase added, and the whole at the first step),
``target.train_time_s``, ``final_step`` and the last ``eval``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from benchmarks.plain_parts import evaluate, recompute_bn, schedule
from fwk.data.registry import DATA
from fwk.models import MODELS
from fwk.track import startup


def built(registry, section: dict):  # noqa: ANN001 - fwk's data or model registry
    entry = registry.get(section["name"])
    return entry.config(**section)


def optimizer(spec: dict, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if spec["name"] == "sgd":
        return torch.optim.SGD(groups, lr=spec["lr"], momentum=spec["momentum"], nesterov=spec["nesterov"])
    if spec["name"] == "adamw":
        return torch.optim.AdamW(groups, lr=spec["lr"], betas=(spec["beta1"], spec["beta2"]))
    raise SystemExit(f"plain loop: optimizer {spec['name']} is not one a plain loop here writes (adamw, sgd)")


def main(folder: Path) -> None:
    startup.mark("imports")  # the interpreter, torch and the model and data code
    spec = json.loads((folder / "spec.json").read_text())
    metric, target, device, amp = spec["metric"], spec["target"], spec["device"], spec.get("amp")
    torch.manual_seed(spec["seed"])
    data = DATA.get(spec["data"]["name"]).builder(built(DATA, spec["data"]), seed=spec["seed"])
    startup.mark("data")
    model = MODELS.get(spec["model"]["name"]).builder(built(MODELS, spec["model"])).to(device)
    startup.mark("model")
    opt = optimizer(spec["optim"], model)
    startup.mark("optimizer")
    s = spec["schedule"]
    sched = schedule(opt, s["warmup_steps"], s["min_lr_ratio"], s["steps"])
    batch = spec["batch_size"]
    loader = DataLoader(data.train, batch_size=batch, shuffle=True, drop_last=True, collate_fn=data.collate)
    val = DataLoader(data.val, batch_size=batch, collate_fn=data.collate)
    reached = lambda row: row[metric] >= target if metric == "val_acc" else row[metric] <= target  # noqa: E731
    step, trained, rows, window, first, hit, last = 0, 0.0, [], [], None, None, {}
    while step < spec["max_steps"] and hit is None:
        for x, y in loader:
            first = first or startup.first_step()
            t0 = time.perf_counter()
            x, y = x.to(device), y.to(device)
            with torch.autocast(device, torch.bfloat16, enabled=amp == "bf16"):
                logits = model(x)
            logits = logits.reshape(-1, logits.size(-1)).float()
            loss = F.cross_entropy(logits, y.reshape(-1), label_smoothing=spec["label_smoothing"])
            loss.backward()
            if spec["grad_clip"]:
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec["grad_clip"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            step += 1
            if device == "cuda":
                torch.cuda.synchronize()
            trained += time.perf_counter() - t0
            window.append(loss.detach())
            if spec["record"] and step % spec["log_every"] == 0:
                rows.append(
                    {"step": step, "kind": "train", "loss": torch.stack(window).mean().item(), "train_s": trained}
                )
                window = []
            if step % spec["eval_every"] == 0 or step == spec["max_steps"]:
                recompute_bn(model, loader, spec["bn_recompute"], device)
                last = evaluate(model, val, spec["eval_batches"], device, amp)
                rows.append({"step": step, "kind": "eval", **last, "train_s": trained})
                if reached(last):
                    hit = {"reached": True, "step": step, "train_time_s": trained, "at": time.time()}
                    break
            if step == spec["max_steps"]:
                break
    summary = {
        "first_step_at": first,
        "startup": startup.phases(first),
        "startup_memory_mib": startup.memory(),
        "final_step": step,
        "eval": last,
        "target": hit or {"reached": False},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    if spec["record"]:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "config.yaml").write_text(f"recipe: plain loop\ntrain:\n  batch_size: {batch}\n  accum_steps: 1\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
