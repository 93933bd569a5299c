"""Every recipe and every config option composes and validates; mistakes are one line."""

from pathlib import Path

import pytest

from fwk.config.compose import compose
from fwk.config.grammar import recipe_names, resources_root
from fwk.config.validate import to_typed
from fwk.errors import UserError

GROUPS = ["model", "data", "optim", "precision", "parallel", "memory"]


def test_recipes_exist() -> None:
    assert {"digits_cnn", "gpt_stdlib", "resnet50_imagenet"} <= set(recipe_names())


@pytest.mark.parametrize("recipe", recipe_names())
def test_every_recipe_composes(recipe: str) -> None:
    cfg = to_typed(
        compose(
            [f"recipe={recipe}", "data.root=/nonexistent"] if recipe == "resnet50_imagenet" else [f"recipe={recipe}"]
        )
    )
    assert cfg.recipe == recipe
    assert cfg.train.max_steps > 0


def _options() -> list[tuple[str, str]]:
    conf = resources_root() / "conf"
    return [(g, p.stem) for g in GROUPS for p in sorted((conf / g).glob("*.yaml")) if p.stem != "custom"]


@pytest.mark.parametrize("group,option", _options(), ids=lambda x: str(x))
def test_every_option_composes(group: str, option: str) -> None:
    # a recipe fixes some keys of its own model/data; start from one that fits each option
    overrides = [f"{group}={option}"]
    if group in ("model", "data") and option in ("gpt", "stdlib_text"):
        overrides.insert(0, "recipe=gpt_stdlib")
    elif group in ("model", "data") and option in ("resnet50", "imagefolder", "synthetic"):
        overrides.insert(0, "recipe=resnet50_imagenet")
    cfg = to_typed(compose(overrides))
    assert getattr(cfg, group).name == option


def test_default_recipe_is_digits() -> None:
    cfg = to_typed(compose([]))
    assert (cfg.recipe, cfg.model.name, cfg.data.name) == ("digits_cnn", "small_cnn", "digits")


def test_overrides_use_hydra_grammar() -> None:
    cfg = to_typed(compose(["optim.lr=0.01", "model.channels1=8", "precision=bf16", "seed=7"]))
    assert (cfg.optim.lr, cfg.model.channels1, cfg.precision.name, cfg.seed) == (0.01, 8, "bf16", 7)


def test_custom_target_model() -> None:
    cfg = to_typed(
        compose(["model=custom", "model._target_=torch.nn.Linear", "+model.in_features=64", "+model.out_features=10"])
    )
    assert cfg.model == {"_target_": "torch.nn.Linear", "in_features": 64, "out_features": 10}


@pytest.mark.parametrize("target", ["model._target_=torch.nn.Linear", "+model._target_=torch.nn.Linear"])
def test_target_without_model_custom_picks_custom(target: str) -> None:
    # a class's arguments are new keys: `+` or not, both add them
    cfg = to_typed(compose([target, "model.in_features=64", "+model.out_features=10"]))
    assert cfg.model == {"_target_": "torch.nn.Linear", "in_features": 64, "out_features": 10}


def test_custom_target_data() -> None:
    cfg = to_typed(compose(["data._target_=my_pkg.build", "data.root=/d"]))
    assert cfg.data == {"_target_": "my_pkg.build", "root": "/d"}


@pytest.mark.parametrize("tags", ["tags=[baseline,lr-sweep]", "+tags=[baseline,lr-sweep]"])
def test_tags(tags: str) -> None:
    assert to_typed(compose([tags])).tags == ["baseline", "lr-sweep"]
    assert to_typed(compose([])).tags == []


def test_plus_on_an_existing_key_sets_it() -> None:
    cfg = to_typed(compose(["+train.max_steps=7", "+model.channels1=8"]))
    assert (cfg.train.max_steps, cfg.model.channels1) == (7, 8)


def test_an_elastic_node_range_sets_the_fewest_and_the_most(monkeypatch: pytest.MonkeyPatch) -> None:
    parallel = to_typed(compose(["parallel.nnodes=1:2"])).parallel
    assert (parallel.min_nnodes, parallel.nnodes) == (1, 2)
    assert to_typed(compose(["parallel.nnodes=2"])).parallel.min_nnodes == 0  # no range
    monkeypatch.setenv("NNODES", "2")  # an interpolation's colon is no range
    assert to_typed(compose(["parallel.nnodes=${oc.env:NNODES}"])).parallel.nnodes == 2


def test_runs_root_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FWK_RUNS", str(tmp_path))
    assert to_typed(compose([])).paths.runs == str(tmp_path)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["recipe=nope"],
            "unknown recipe 'nope'; choose one of: digits_cnn, gpt_stdlib, gpt_stdlib_fast, hf_llama_stdlib, "
            "resnet50_imagenet",
        ),
        (["model=nope"], "unknown model 'nope'"),
        (["optim.lr=-0.1"], "optim.lr=-0.1 is not allowed: expected a number > 0"),
        (
            ["train.batch_size=63", "parallel.nproc_per_node=2"],
            "train.batch_size=63 is not allowed: expected a multiple of the data-parallel degree 2",
        ),
        (["model.channels1=abc"], "model.channels1='abc' is not allowed: expected an integer (fix it with model."),
        (["optim.lr=abc"], "optim.lr='abc' is not allowed: expected a number (fix it with optim.lr=...)"),
        (["train.max_steps=1.5"], "train.max_steps='1.5' is not allowed: expected an integer"),
        (["train.deterministic=maybe"], "train.deterministic='maybe' is not allowed: expected true or false"),
        (["train.nope=1"], "unknown key 'train.nope'; valid keys here: max_steps, batch_size,"),
        (["train.max_stepz=3"], "unknown key 'train.max_stepz'; did you mean train.max_steps? valid keys here: max_"),
        (["trainr.max_steps=3"], "unknown key 'trainr'; did you mean train? valid keys here: recipe, seed,"),
        (["+train.max_stepz=3"], "unknown key 'train.max_stepz'; did you mean train.max_steps? valid keys here: max_"),
        (["recipe=gpt_stdlib", "model.n_layr=2"], "unknown key 'model.n_layr'; did you mean model.n_layer?"),
        (["precision.keep_fp3=[a]"], "unknown key 'precision.keep_fp3'; did you mean precision.keep_fp32?"),
        (["precision.name=fp99"], "precision.name='fp99' is not allowed"),
        (["parallel=none", "parallel.nproc_per_node=2"], "parallel.name='none' is not allowed"),
        (["model=custom"], "model._target_ is not set"),
        (["model=gpt", "model._target_=a.B"], "write model=custom model._target_=pkg.Class"),
        (["precision._target_=a.B"], "precision takes no _target_ (there is no precision=custom); choose"),
        (["+foo=1"], "unknown key 'foo'"),
        (
            ["train.label_smoothing=0.1"],
            "train.label_smoothing is gone; label smoothing is a method now: methods=[label_smoothing] "
            "method.label_smoothing.smoothing=X (0.1 by default)",
        ),
        (
            ["recipe=gpt_stdlib", "data.seq_len=256"],
            "data.seq_len=256 is not allowed: expected at most model.block_size=128",
        ),
        (["seed=[1"], "seed=[1"),
        (["precision=fp99"], "unknown precision 'fp99'; choose one of: auto, bf16, fp16, fp32, staged"),
        (["memory=swap"], "unknown memory 'swap'; choose one of: auto, checkpoint, microbatch, none, offload"),
        (
            ["precision=staged", "precision.warmup_frac=0.6", "precision.final_frac=0.4"],
            "precision.warmup_frac=0.6 is not allowed: expected warmup_frac + final_frac < 1 (now 1)",
        ),
        (
            ["precision=staged", "precision.warmup_steps=290"],
            "precision.warmup_steps=290 is not allowed: expected fewer than train.max_steps - final phase = 285",
        ),
        (
            ["memory=microbatch", "memory.micro_batches=3"],
            "memory.micro_batches=3 is not allowed: expected a divisor of the per-rank batch 64",
        ),
        (["precision.channels_last=maybe"], "precision.channels_last='maybe' is not allowed: expected one of auto"),
        (["precision.dtype=fp8"], "precision.dtype='fp8' is not allowed: expected one of auto, bf16, fp16"),
        (["precision.backoff_factor=1.5"], "precision.backoff_factor=1.5 is not allowed: expected a number in (0, 1)"),
        (["train.accum_steps=0"], "train.accum_steps=0 is not allowed"),
        (["memory.budget_gb=-1"], "memory.budget_gb=-1.0 is not allowed"),
        (["memory.offload_dir=/no/such/folder"], "memory.offload_dir='/no/such/folder' is not allowed: expected an"),
        (["precision.max_trial_share=2"], "precision.max_trial_share=2.0 is not allowed: expected a share in [0, 1]"),
        (
            ["parallel.nnodes=1:2", "parallel.rdzv_backend=static"],
            "parallel.rdzv_backend='static' is not allowed: expected c10d with an elastic range",
        ),
        (
            ["parallel.nnodes=2:4", "train.batch_size=64"],  # 16 each on 4; 3 machines cannot hold 64 that way
            "train.batch_size=64 is not allowed: expected a global batch that 1 x 3 processes share evenly, each with "
            "at most 16 samples (after losing machines, parallel.nnodes=2:4)",
        ),
        (
            ["parallel.min_nnodes=3", "parallel.nnodes=2"],
            "parallel.min_nnodes=3 is not allowed: expected an integer in",
        ),
        (["parallel.nnodes=3:2"], "parallel.nnodes=3:2 is not an elastic range: expected MIN:MAX with 1 <= MIN <= MAX"),
        (["parallel.nnodes=0:2"], "parallel.nnodes=0:2 is not an elastic range: expected MIN:MAX with 1 <= MIN <= MAX"),
        (["parallel.nnodes=a:b"], "parallel.nnodes=a:b is not an elastic range: expected MIN:MAX with 1 <= MIN <= MAX"),
        (["parallel.nnodes=0"], "parallel.nnodes=0 is not allowed: expected an integer >= 1"),
        (["parallel.nproc_per_node=0"], "parallel.nproc_per_node=0 is not allowed: expected an integer >= 1"),
        (
            ["seed=-1"],
            "seed=-1 is not allowed: expected an integer in [0, 4294967295] (numpy seeds take 0 to 2**32 - 1)",
        ),
        (["seed=4294967296"], "seed=4294967296 is not allowed: expected an integer in [0, 4294967295]"),
        (
            ["seed=4294967295", "parallel.nproc_per_node=2"],
            "seed=4294967295 is not allowed: expected an integer in [0, 4294967294] (numpy seeds take 0 to 2**32 - 1, "
            "and rank r seeds with seed + r)",
        ),
        (["data=synthetic", "data.num_classes=0"], "data.num_classes=0 is not allowed: expected an integer >= 1"),
        (["data=synthetic", "data.num_classes=-3"], "data.num_classes=-3 is not allowed: expected an integer >= 1"),
        (["data=synthetic", "data.image_size=0"], "data.image_size=0 is not allowed: expected an integer >= 1 (the"),
        (["data=imagefolder", "data.image_size=-1"], "data.image_size=-1 is not allowed: expected an integer >= 1"),
        (["data=streaming", "data.image_size=0"], "data.image_size=0 is not allowed: expected an integer >= 1"),
        (["data.image_size=4"], "data.image_size=4 is not allowed: expected an integer >= 8 (the digits are 8x8 px"),
        (
            ["train.deterministic=true", "parallel.adapt.enabled=true"],
            "parallel.adapt.enabled=True is not allowed: expected false with train.deterministic=true",
        ),
    ],
)
def test_bad_overrides_are_one_line(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError) as err:
        to_typed(compose(overrides))
    message = str(err.value)
    assert expected in message
    assert "\n" not in message


def test_a_recorded_config_with_a_moved_key_says_where_it_went() -> None:
    """A run recorded before train.label_smoothing moved (fwk replay reads its config.yaml)."""
    from fwk.config.resolve import from_dict, resolve

    recorded = resolve([]).as_dict
    recorded["train"]["label_smoothing"] = 0.1
    with pytest.raises(UserError, match=r"^train.label_smoothing is gone; label smoothing is a method now"):
        from_dict(recorded)


@pytest.mark.parametrize("recipe", recipe_names())
def test_the_hashed_dict_is_omegaconfs_round_trip_of_the_typed_config(recipe: str) -> None:
    """``from_dict`` takes ``dataclasses.asdict`` for the dict the run id hashes: for every
    recipe it must equal what OmegaConf's structured round trip gives (no enums, no tuples)."""
    from omegaconf import OmegaConf

    from fwk.config.resolve import resolve

    r = resolve([f"recipe={recipe}"])
    assert r.as_dict == OmegaConf.to_container(OmegaConf.structured(r.config), resolve=True)
