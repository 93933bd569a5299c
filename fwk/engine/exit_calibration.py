"""Calibration of ``early_exit``'s threshold (``fwk.methods.early_exit``): what each exit says on
the validation split, and the largest entropy threshold that keeps the metric within
``max_drop`` of the full model's.

The rule at inference: a sample (an image, or a token of a language model) leaves at the first
exit whose softmax entropy is at most the threshold ``t``, else runs the whole model. With
``c_k`` the smallest entropy among exits ``0..k``, it leaves at the first ``k`` with
``c_k <= t``; so the candidates are the observed ``c_k``. Each is tried (up to ``CANDIDATES``
of them, else that many evenly spaced by rank), and the metric it gives is measured exactly:
the share of correct predictions (classification) or the mean loss per token (language
models), each sample scored at the exit it leaves at."""

from __future__ import annotations

from typing import Any

import numpy as np

CANDIDATES = 2048
CHUNK = 64  # candidate thresholds evaluated at once


def collect(
    method: Any, model: Any, val: Any, precision: Any, task: str, dist: Any, max_batches: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Run the validation split through ``model``; return each exit's entropies (N, K), each
    exit's and the final output's per-sample scores (N, K+1; 1/0 correct, or the loss per
    token for language models) and K. Ranks' shards are gathered, so every rank gets all."""
    import torch
    import torch.nn.functional as F

    was = model.training
    model.eval()
    entropies, scores = [], []
    with torch.no_grad():
        for i, (x, y) in enumerate(val):
            if max_batches and i >= max_batches:
                break
            x, y = x.to(dist.device), y.to(dist.device)
            with precision.autocast():
                logits = model(x)
                exits = method.exit_logits()
            target = y.reshape(-1)
            h, s = [], []
            for z in (*exits, logits):
                logp = F.log_softmax(z.reshape(-1, z.size(-1)).float(), dim=-1)
                h.append(-(logp.exp() * logp).sum(-1))
                nll = -logp.gather(1, target[:, None])[:, 0]
                s.append(nll if task == "lm" else (logp.argmax(-1) == target).float())
            entropies.append(torch.stack(h[:-1], 1).cpu())
            scores.append(torch.stack(s, 1).cpu())
    model.train(was)
    k = len(method.exits)
    ent = torch.cat(entropies).double().numpy() if entropies else np.zeros((0, k))
    sc = torch.cat(scores).double().numpy() if scores else np.zeros((0, k + 1))
    if dist.world_size > 1:
        import torch.distributed as td

        parts: list[Any] = [None] * dist.world_size
        td.all_gather_object(parts, (ent, sc))
        ent, sc = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    return ent, sc, k


def exit_taken(entropies: np.ndarray, threshold: float) -> np.ndarray:
    """Return the exit each sample leaves at under ``threshold``: 0..K-1, or K for the full model."""
    leave = np.minimum.accumulate(entropies, axis=1) <= threshold
    return np.where(leave.any(axis=1), leave.argmax(axis=1), entropies.shape[1])


def calibrate(
    entropies: np.ndarray, scores: np.ndarray, k: int, task: str, max_drop: float, depths: list[float]
) -> dict[str, Any]:
    """Return the largest threshold within ``max_drop`` and what it gives (see the module's doc)."""
    n = len(scores)
    full = float(scores[:, k].mean()) if n else float("nan")
    lowest = np.minimum.accumulate(entropies, axis=1) if n else np.zeros((0, k))
    candidates = np.unique(lowest)[::-1]  # largest first
    if len(candidates) > CANDIDATES:
        candidates = candidates[np.linspace(0, len(candidates) - 1, CANDIDATES).round().astype(int)]
    rows = np.arange(n)
    threshold = None
    for start in range(0, len(candidates), CHUNK):
        ts = candidates[start : start + CHUNK]
        leave = lowest[None, :, :] <= ts[:, None, None]  # (T, N, K)
        taken = np.where(leave.any(axis=2), leave.argmax(axis=2), k)  # (T, N)
        metric = scores[rows[None, :], taken].mean(axis=1)
        ok = metric <= full + max_drop if task == "lm" else metric >= full - max_drop
        if ok.any():
            threshold = float(ts[int(np.argmax(ok))])  # the first ok is the largest
            break
    taken = exit_taken(entropies, threshold) if threshold is not None else np.full(n, k)
    share = [float((taken == e).mean()) if n else 0.0 for e in range(k + 1)]
    return {
        "threshold": threshold,  # None: no exit keeps the metric within max_drop, so all run the full model
        "metric": "val_loss" if task == "lm" else "val_acc",
        "full": full,
        "with_exits": float(scores[rows, taken].mean()) if n else float("nan"),
        "max_drop": max_drop,
        "exit_metric": [float(scores[:, e].mean()) if n else float("nan") for e in range(k)],
        "share": share,  # leaving at each exit, then at the end
        "mean_depth": float(sum(s * d for s, d in zip(share, [*depths, 1.0], strict=True))),
        "samples": n,
        "candidates": int(len(candidates)),
    }
