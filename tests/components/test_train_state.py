import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fwk.components.train_state import is_flat, load_model_state, model_state, rng_state, set_rng_state


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(np.random.randn()), torch.rand(3).tolist()


def test_rng_state_through_a_weights_only_file_replays_every_generator(tmp_path: Path) -> None:
    np.random.randn()  # leaves a cached gaussian, which the state must carry too
    torch.save(rng_state(), tmp_path / "rng.pt")
    first = _draws()
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert _draws() == first


def _trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).square().sum().backward()
    opt.step()
    return model, opt


def test_model_state_restores_weights_and_optimizer_moments() -> None:
    model, opt = _trained(0)
    saved = model_state(model, opt)
    assert not is_flat(saved["optimizer"])  # an unsharded model: Optimizer.state_dict()'s indices
    other, other_opt = _trained(1)
    load_model_state(other, other_opt, saved)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(opt.state[a]["exp_avg_sq"], other_opt.state[b]["exp_avg_sq"])


def test_is_flat_tells_a_state_flattened_by_name() -> None:
    assert is_flat({"state.fc.weight.exp_avg": torch.zeros(1), "param_groups.fc.weight.lr": 0.1})
    assert not is_flat({"state": {0: {}}, "param_groups": [{"params": [0]}]})
