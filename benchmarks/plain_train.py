"""The plain PyTorch script a user would write for the default recipe (digits_cnn), to time
`fwk train` against as a whole process: same data split and normalization, same model,
optimizer, schedule, batch, steps; evaluates once at the end and saves the weights.

    .venv/bin/python -m benchmarks.plain_train [--steps 300] [--out /tmp/plain.pt]
"""

import argparse
import math

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from fwk.models.cnn import SmallCNN


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="plain.pt")
    args = parser.parse_args()
    torch.manual_seed(0)
    raw = load_digits()
    x = torch.as_tensor(raw.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    y = torch.as_tensor(raw.target)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    val, tr = perm[:300], perm[300:]
    mean, std = x[tr].mean(), x[tr].std()
    x = (x - mean) / std
    loader = DataLoader(TensorDataset(x[tr], y[tr]), batch_size=64, shuffle=True, drop_last=True)
    model = SmallCNN(1, 32, 64, 128, 10)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    warm = 20  # linear warm-up, then cosine decay to 0, as the recipe's schedule
    decay = max(1, args.steps - warm)
    lr = lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / decay))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr)
    step = 0
    while step < args.steps:
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            step += 1
            if step == args.steps:
                break
    model.eval()
    with torch.no_grad():
        acc = (model(x[val]).argmax(-1) == y[val]).float().mean().item()
    torch.save(model.state_dict(), args.out)
    print(f"step {step}: loss {loss.item():.4f}, val_acc {acc:.4f}")


if __name__ == "__main__":
    main()
