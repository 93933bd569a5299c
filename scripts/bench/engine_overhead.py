"""fwk's engine against a plain PyTorch loop: same model, data, optimizer and steps.

    .venv/bin/python scripts/bench/engine_overhead.py [--steps 300]

Prints the training throughput of each and their ratio (fwk / plain; 1.00 = no overhead).
Both run in this process, one after the other, on the default digits_cnn recipe.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from fwk.config.compose import compose
from fwk.config.validate import to_typed
from fwk.data import DATA
from fwk.engine.trainer import train
from fwk.models import MODELS
from fwk.optim import build_optimizer, build_schedule
from fwk.track.store import open_run


def plain_loop(cfg, steps: int) -> float:
    """The 30-line loop a user would write; returns samples/s."""
    torch.manual_seed(cfg.seed)
    data = DATA.get(cfg.data.name).builder(cfg.data, seed=cfg.seed)
    model = MODELS.get(cfg.model.name).builder(cfg.model)
    opt = build_optimizer(cfg.optim, model)
    sched = build_schedule(cfg.schedule, opt, steps)
    loader = torch.utils.data.DataLoader(data.train, batch_size=cfg.train.batch_size, shuffle=True, drop_last=True)
    done, start = 0, time.perf_counter()
    while done < steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            done += 1
            if done == steps:
                break
    return steps * cfg.train.batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    overrides = [f"train.max_steps={args.steps}", "train.eval_every=0", f"train.log_every={args.steps}"]
    cfg = to_typed(compose(overrides))
    plain = plain_loop(cfg, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        text = OmegaConf.to_yaml(OmegaConf.structured(cfg))
        run = open_run(Path(tmp), "bench", text, "bench", 1)
        summary = train(cfg, run)
    assert summary is not None
    fwk_rate = summary["samples_per_s"]
    print(f"digits_cnn, {args.steps} steps, batch {cfg.train.batch_size}, {torch.get_num_threads()} threads")
    print(f"plain loop   {plain:10.0f} samples/s")
    print(f"fwk engine   {fwk_rate:10.0f} samples/s")
    print(f"ratio fwk/plain: {fwk_rate / plain:.2f}")


if __name__ == "__main__":
    main()
