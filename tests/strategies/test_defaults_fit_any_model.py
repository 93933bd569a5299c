"""A recipe's defaults work with a user's own model: every recipe, with `model._target_` set
to a model of the user's, under every precision option, as on every kind of hardware the
probe reports (mocked: no test depends on the CPU that runs it)."""

from __future__ import annotations

import pytest
import torch

from fwk.config.grammar import recipe_names
from fwk.config.instantiate import instantiate, model_arguments
from fwk.config.resolve import resolve
from fwk.distributed.group import Dist
from fwk.errors import UserError
from fwk.strategies import hardware, parallelize
from fwk.strategies import precision as precision_module
from fwk.strategies.preflight import preflight

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# name -> (what the probe reports, the device its choice is made for)
PROBES = {
    "amx-cpu": (hardware.Features(True, True, "CPU (AVX512): AMX yes, AVX512-BF16 yes"), CPU),
    "avx512-bf16-cpu": (hardware.Features(True, True, "CPU (AVX512): AMX no, AVX512-BF16 yes"), CPU),
    "avx2-cpu": (hardware.Features(False, True, "CPU (AVX2): AMX no, AVX512-BF16 no"), CPU),
    "cuda-7.0": (hardware.Features(False, True, "Tesla V100, compute capability 7.0"), CUDA),
    "cuda-9.0": (hardware.Features(True, True, "H100, compute capability 9.0"), CUDA),
}
USER_MODEL = {"gpt_stdlib": "tests.strategies.user_models.UserLM"}  # the others take images
EXTRA = {"resnet50_imagenet": ["data=synthetic"]}  # no ImageNet here: the data is not read anyway


@pytest.mark.parametrize("option", ["fp32", "bf16", "fp16", "staged", "auto"])
@pytest.mark.parametrize("recipe", recipe_names())
def test_every_recipe_takes_a_user_model(
    monkeypatch: pytest.MonkeyPatch, said: pytest.LogCaptureFixture, recipe: str, option: str
) -> None:
    target = USER_MODEL.get(recipe, "tests.strategies.user_models.UserNet")
    overrides = [
        f"recipe={recipe}",
        f"model._target_={target}",
        f"precision={option}",
        "jit=off",
        *EXTRA.get(recipe, []),
    ]
    cfg = resolve(overrides).config
    section, left_out = model_arguments(cfg.model)
    assert "_target_" in section and not set(left_out) & set(section)
    original = precision_module.choose_format
    for name, (features, device) in PROBES.items():
        monkeypatch.setattr(hardware, "probe", lambda _device, features=features: features)
        monkeypatch.setattr(precision_module, "choose_format", lambda f, _d, device=device: original(f, device))
        preflight(cfg)  # nothing the user typed names a module: the recipe's patterns are not checked here
        said.clear()  # this probe's lines only
        strategies = parallelize.Strategies(cfg, SOLO, cfg.train.batch_size)
        model = instantiate(section)
        raw, _ = strategies.apply(model, optimizer_floats=2.0)
        p = strategies.precision
        islands = [type(m).__name__ for m in p.fp32_islands()]
        if cfg.precision.keep_fp32:  # every recipe keeps its classifier / LM head (last:Linear) in fp32
            assert "last:Linear" in p.keep_patterns and "Linear" in islands, (name, islands)
        unmatched = [q for q in cfg.precision.keep_fp32 if q not in p.keep_patterns]
        lines = said.messages
        assert all(any(f"'{q}'" in line and "left out" in line for line in lines) for q in unmatched), (name, lines)


def test_a_pattern_or_argument_the_user_typed_stays_strict() -> None:
    cfg = resolve(["model._target_=tests.strategies.user_models.UserNet", "precision.keep_fp32=[head.4]"]).config
    with pytest.raises(UserError, match="precision.keep_fp32: 'head.4' matches no module of the model"):
        preflight(cfg, typed={"precision.keep_fp32"})
    cfg = resolve(["model._target_=tests.strategies.user_models.UserNet", "+model.depth=3"]).config
    with pytest.raises(UserError, match="model.depth: tests.strategies.user_models.UserNet takes no argument 'depth'"):
        preflight(cfg, typed={"model.depth"})
    preflight(cfg)  # a key the recipe gave: left out instead
