"""The validation that turns a composed or stored config into the typed ``Config``, or one clear error line.

The launcher uses it after composing, and every worker on the stored config.yaml. It imports
the registries' config dataclasses, without torch, but never Hydra's composition.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from fwk.config.elastic import elastic_rules
from fwk.config.methods import rules as method_rules
from fwk.config.parallel_rules import rules as parallel_rules
from fwk.config.parallel_rules import world_rules
from fwk.config.schema import (
    AMP_DTYPES,
    COMPILE_MODES,
    DECAYS,
    JITS,
    KERNELS,
    LOADERS,
    MEMORIES,
    METHODS,
    ON_NAN,
    PRECISIONS,
    SWITCHES,
    TRACKINGS,
    Config,
    layout,
)
from fwk.config.target import EVAL_METRICS, parse_target
from fwk.errors import UserError


def invalid(key: str, value: Any, allowed: str) -> UserError:
    return UserError(f"{key}={value!r} is not allowed: expected {allowed} (fix it with {key}=...)")


# keys that moved: where each one went (an override or a recorded config that still names it)
MOVED = {
    "train.label_smoothing": "label smoothing is a method now: methods=[label_smoothing] "
    "method.label_smoothing.smoothing=X (0.1 by default)",
}


def unknown_key(key: str, valid: list[str]) -> UserError:
    """Return the error for a key the config does not have.

    It says where the key moved, or else the closest valid one at that level, and all of them."""
    if key.lstrip("+") in MOVED:
        return UserError(f"{key.lstrip('+')} is gone; {MOVED[key.lstrip('+')]}")
    prefix, _, last = key.rpartition(".")
    close = difflib.get_close_matches(last, valid, n=1, cutoff=0.6)
    hint = f"did you mean {prefix + '.' if prefix else ''}{close[0]}? " if close else ""
    return UserError(f"unknown key '{key}'; {hint}valid keys here: {', '.join(valid)}")


def registries() -> dict[str, Any]:
    from fwk.data import DATA
    from fwk.models import MODELS
    from fwk.optim import OPTIMIZERS

    return {"model": MODELS, "data": DATA, "optim": OPTIMIZERS}


def _merge(schema: Any, values: Any, prefix: str) -> DictConfig:
    """Merge values into a structured schema.

    Unknown keys and bad types become UserError."""
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), values)
    except ConfigKeyError as exc:
        key = f"{prefix}{exc.full_key}" if exc.full_key else prefix.rstrip(".")
        level = exc.parent_node if exc.parent_node is not None else OmegaConf.structured(schema)
        raise unknown_key(key, [str(k) for k in level.keys()]) from None
    except OmegaConfBaseException as exc:
        key = f"{prefix}{exc.full_key}"
        raise UserError(f"{key}: {str(exc.msg).splitlines()[0]}") from None


def _typed_section(name: str, section: Any, registry: Any) -> Any:
    """Turn a registry section into its config dataclass.

    A `_target_` section stays a dict."""
    if not isinstance(section, (dict, DictConfig)):
        raise invalid(name, section, f"a mapping with a 'name' ({', '.join(registry.names())}) or a '_target_'")
    section = OmegaConf.create(section) if isinstance(section, dict) else section
    if "_target_" in section.keys():
        if OmegaConf.is_missing(section, "_target_"):
            raise UserError(f"{name}._target_ is not set; give your class, e.g. {name}._target_=my_pkg.MyClass")
        return OmegaConf.to_container(section, resolve=True)
    choice = section.get("name")
    if choice not in registry:
        raise UserError(
            f"{name}.name={choice!r} is not a registered {registry.kind}; choose one of: "
            f"{', '.join(registry.names())} (or set {name}._target_=your.module.Class)"
        )
    return OmegaConf.to_object(_merge(registry.config(choice), section, f"{name}."))


def to_typed(raw: dict[str, Any] | DictConfig) -> Config:
    """Validate and type a resolved config.

    A bad key raises UserError naming it."""
    raw = OmegaConf.create(raw) if isinstance(raw, dict) else raw
    sections = {key: raw.get(key, {}) for key in registries()}
    rest = {k: v for k, v in raw.items() if k not in sections}
    cfg: Config = OmegaConf.to_object(_merge(Config, rest, ""))
    for key, registry in registries().items():
        setattr(cfg, key, _typed_section(key, sections[key], registry))
    for ok, key, value, allowed in _rules(cfg):
        if not ok:
            raise invalid(key, value, allowed)
    return cfg


def _target_problem(text: str) -> str | None:
    if not text:
        return None
    try:
        parse_target(text)
    except ValueError as exc:
        return str(exc)
    return None


def _rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    """Yield (holds, key, value, what is allowed) for every cross-field and range check.

    The checks run in this order, and the first that fails is the error the user sees.
    """
    yield from world_rules(c)
    yield from _train_rules(c)
    yield from _optim_rules(c)
    yield from _data_rules(c)
    yield from _best_and_schedule_rules(c)
    yield from _loader_rules(c)
    yield from _checkpoint_rules(c)
    yield from _precision_rules(c)
    yield from _memory_rules(c)
    yield from _jit_rules(c)
    yield from _diagnostics_rules(c)
    yield from parallel_rules(c)
    yield from elastic_rules(c)
    yield from _adapt_rules(c)


# numpy's legacy seeding (np.random.seed, fwk/engine/state.py) takes 0 <= seed < 2**32, and rank
# r of a run seeds its streams with seed + r: the largest seed leaves room for every rank
SEEDS = 2**32


def _train_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    t = c.train
    most = SEEDS - c.world_size
    ranks = ", and rank r seeds with seed + r" if c.world_size > 1 else ""
    yield 0 <= c.seed <= most, "seed", c.seed, f"an integer in [0, {most}] (numpy seeds take 0 to 2**32 - 1{ranks})"
    yield t.max_steps > 0, "train.max_steps", t.max_steps, "an integer > 0"
    yield t.batch_size > 0, "train.batch_size", t.batch_size, "an integer > 0"
    yield t.eval_every >= 0, "train.eval_every", t.eval_every, "an integer >= 0"
    yield t.eval_batches >= 0, "train.eval_batches", t.eval_batches, "an integer >= 0"
    yield t.log_every > 0, "train.log_every", t.log_every, "an integer > 0"
    yield t.grad_clip >= 0, "train.grad_clip", t.grad_clip, "a number >= 0 (0 = off)"
    yield t.device in ("auto", "cpu", "cuda"), "train.device", t.device, "one of auto, cpu, cuda"
    problem = _target_problem(t.stop_at)
    yield problem is None, "train.stop_at", t.stop_at, problem or ""
    yield t.early_stop_patience >= 0, "train.early_stop_patience", t.early_stop_patience, "an integer >= 0"
    yield (
        not t.early_stop_patience or bool(c.checkpoint.best),
        "train.early_stop_patience",
        t.early_stop_patience,
        "0 unless checkpoint.best names the metric to watch (checkpoint.best=val_acc)",
    )


def _optim_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    p = c.parallel
    optim_name = c.optim.get("name") if isinstance(c.optim, dict) else getattr(c.optim, "name", None)
    from fwk.optim import WHOLE_TENSORS  # the same refusal as parallel=auto's choice of FSDP (check_sharding)

    dims, _ = layout(p, c.world_size)
    sharded = dims is not None and (dims.shards or dims.tp > 1)
    for name, why in WHOLE_TENSORS.items():
        yield (
            optim_name != name or not sharded,
            "parallel.name",
            p.name,
            f"ddp, none or auto with optim={name} ({why}; FSDP and tensor parallel hold shards, pp keeps them whole)",
        )
    rules = getattr(c.optim, "rules", None)  # an optimizer's settings check themselves (not a _target_ dict)
    if rules is not None:
        yield from rules(c)
    for name in c.methods:
        yield name in METHODS, "methods", list(c.methods), f"a list of {', '.join(METHODS.names())}"
    yield len(set(c.methods)) == len(c.methods), "methods", list(c.methods), "each method once"
    yield from method_rules(c)


def _data_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    rules = getattr(c.data, "rules", None)  # a data set's settings check themselves (not a _target_ dict)
    if rules is not None:
        yield from rules(c)


def _best_and_schedule_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    ck = c.checkpoint
    yield not ck.best or ck.best in EVAL_METRICS, "checkpoint.best", ck.best, f"one of {', '.join(EVAL_METRICS)}"
    yield ck.min_improvement >= 0, "checkpoint.min_improvement", ck.min_improvement, "a number >= 0"
    yield ck.patience >= 0, "checkpoint.patience", ck.patience, "an integer >= 0 (0 = never)"
    block, seq = getattr(c.model, "block_size", None), getattr(c.data, "seq_len", None)
    yield block is None or seq is None or seq <= block, "data.seq_len", seq, f"at most model.block_size={block}"
    lr = getattr(c.optim, "lr", None) if not isinstance(c.optim, dict) else c.optim.get("lr")
    yield lr is None or lr > 0, "optim.lr", lr, "a number > 0"
    s = c.schedule
    yield s.warmup_steps >= 0, "schedule.warmup_steps", s.warmup_steps, "an integer >= 0"
    yield s.decay in DECAYS, "schedule.decay", s.decay, f"one of {', '.join(DECAYS)}"
    yield 0 <= s.min_lr_ratio <= 1, "schedule.min_lr_ratio", s.min_lr_ratio, "a number in [0, 1]"
    yield 0 < s.cooldown_frac <= 1, "schedule.cooldown_frac", s.cooldown_frac, "a share of train.max_steps in (0, 1]"


def _checkpoint_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    t = c.train
    yield c.checkpoint.every >= 0, "checkpoint.every", c.checkpoint.every, "an integer >= 0 (0 = only at the end)"
    yield c.checkpoint.keep >= 1, "checkpoint.keep", c.checkpoint.keep, "an integer >= 1"
    on_corrupt = c.checkpoint.on_corrupt
    yield on_corrupt in ("fallback", "error"), "checkpoint.on_corrupt", on_corrupt, "one of fallback, error"
    rewind = c.checkpoint.rewind_at
    yield 0 <= rewind < 1, "checkpoint.rewind_at", rewind, "a share of train.max_steps in [0, 1) (0 = no rewind point)"
    yield t.accum_steps >= 1, "train.accum_steps", t.accum_steps, "an integer >= 1 (1 = no accumulation)"
    yield t.accum_lr in ("sqrt", "fixed"), "train.accum_lr", t.accum_lr, "one of sqrt, fixed"


def _jit_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    j = c.jit
    yield j.name in JITS, "jit.name", j.name, f"one of {', '.join(JITS)}"
    yield j.mode in COMPILE_MODES, "jit.mode", j.mode, f"one of {', '.join(COMPILE_MODES)}"
    yield j.stable_steps >= 1, "jit.stable_steps", j.stable_steps, "an integer >= 1"
    yield j.max_recompiles >= 0, "jit.max_recompiles", j.max_recompiles, "an integer >= 0"
    yield j.min_remaining_s >= 0, "jit.min_remaining_s", j.min_remaining_s, "a number >= 0"
    yield 0 <= j.max_trial_share <= 1, "jit.max_trial_share", j.max_trial_share, "a share in [0, 1]"
    yield j.trial_steps >= 1, "jit.trial_steps", j.trial_steps, "an integer >= 1"
    yield c.kernels.name in KERNELS, "kernels.name", c.kernels.name, f"one of {', '.join(KERNELS)}"


def _diagnostics_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    g = c.diagnostics
    yield g.on_nan in ON_NAN, "diagnostics.on_nan", g.on_nan, f"one of {', '.join(ON_NAN)}"
    yield g.snapshot_every >= 1, "diagnostics.snapshot_every", g.snapshot_every, "an integer >= 1"
    yield 0 < g.lr_factor <= 1, "diagnostics.lr_factor", g.lr_factor, "a number in (0, 1]"
    yield g.max_rollbacks >= 0, "diagnostics.max_rollbacks", g.max_rollbacks, "an integer >= 0"
    yield g.spike_k >= 0, "diagnostics.spike_k", g.spike_k, "a number >= 0 (0 = off)"
    yield g.spike_window >= 2, "diagnostics.spike_window", g.spike_window, "an integer >= 2"
    k = c.tracking
    yield k.name in TRACKINGS, "tracking.name", k.name, f"one of {', '.join(TRACKINGS)}"
    yield (
        not k.mlflow or bool(k.uri.strip()),
        "tracking.uri",
        k.uri,
        "an MLflow tracking URI with tracking=mlflow, e.g. http://127.0.0.1:5000 (or set $MLFLOW_TRACKING_URI)",
    )


def _adapt_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    t, p = c.train, c.parallel
    a = p.adapt
    yield (
        not (a.enabled and t.deterministic),
        "parallel.adapt.enabled",
        a.enabled,
        "false with train.deterministic=true (adapting changes the step from measured times)",
    )
    yield 0 < a.threshold < 1, "parallel.adapt.threshold", a.threshold, "a number in (0, 1)"
    yield a.windows >= 1, "parallel.adapt.windows", a.windows, "an integer >= 1"
    yield (
        not a.enabled or a.max_bucket_mb >= p.bucket_cap_mb,  # only the adaptation grows buckets
        "parallel.adapt.max_bucket_mb",
        a.max_bucket_mb,
        (f"a number >= parallel.bucket_cap_mb ({p.bucket_cap_mb:g})"),
    )
    yield (
        not a.enabled or a.max_accum_steps >= t.accum_steps,
        "parallel.adapt.max_accum_steps",
        a.max_accum_steps,
        (f"an integer >= train.accum_steps ({t.accum_steps})"),
    )


def _precision_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    pr = c.precision
    yield pr.name in PRECISIONS, "precision.name", pr.name, f"one of {', '.join(PRECISIONS)}"
    yield pr.dtype in AMP_DTYPES, "precision.dtype", pr.dtype, f"one of {', '.join(AMP_DTYPES)}"
    switch = pr.channels_last.lower()
    yield switch in SWITCHES, "precision.channels_last", pr.channels_last, f"one of {', '.join(SWITCHES)}"
    yield 0 <= pr.warmup_frac < 1, "precision.warmup_frac", pr.warmup_frac, "a number in [0, 1)"
    yield 0 <= pr.final_frac < 1, "precision.final_frac", pr.final_frac, "a number in [0, 1)"
    yield pr.warmup_steps >= 0, "precision.warmup_steps", pr.warmup_steps, "an integer >= 0 (0 = use warmup_frac)"
    if pr.name == "staged":
        if pr.warmup_steps:
            final = round(pr.final_frac * c.train.max_steps)
            allowed = f"fewer than train.max_steps - final phase = {c.train.max_steps - final}"
            yield pr.warmup_steps + final < c.train.max_steps, "precision.warmup_steps", pr.warmup_steps, allowed
        else:
            total = pr.warmup_frac + pr.final_frac
            allowed = f"warmup_frac + final_frac < 1 (now {total:g}): lower one of them"
            yield total < 1, "precision.warmup_frac", pr.warmup_frac, allowed
    yield pr.init_scale > 0, "precision.init_scale", pr.init_scale, "a number > 0"
    yield pr.growth_factor > 1, "precision.growth_factor", pr.growth_factor, "a number > 1"
    yield 0 < pr.backoff_factor < 1, "precision.backoff_factor", pr.backoff_factor, "a number in (0, 1)"
    yield pr.growth_interval >= 1, "precision.growth_interval", pr.growth_interval, "an integer >= 1"
    yield pr.probe_steps >= 0, "precision.probe_steps", pr.probe_steps, "an integer >= 0 (0 = no range probe)"
    yield pr.fp16_headroom >= 1, "precision.fp16_headroom", pr.fp16_headroom, "a number >= 1"
    yield pr.trial_steps >= 1, "precision.trial_steps", pr.trial_steps, "an integer >= 1"
    yield pr.min_speedup >= 1, "precision.min_speedup", pr.min_speedup, "a number >= 1"
    yield 0 <= pr.max_trial_share <= 1, "precision.max_trial_share", pr.max_trial_share, "a share in [0, 1]"


def _memory_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    m = c.memory
    dims, _ = layout(c.parallel, c.world_size)
    per_rank = c.train.batch_size // (dims.batch_degree if dims is not None else c.world_size)
    yield m.name in MEMORIES, "memory.name", m.name, f"one of {', '.join(MEMORIES)}"
    yield m.every >= 1, "memory.every", m.every, "an integer >= 1 (1 = every block)"
    yield m.micro_batches >= 1, "memory.micro_batches", m.micro_batches, "an integer >= 1"
    yield m.budget_gb >= 0, "memory.budget_gb", m.budget_gb, "a number >= 0 (0 = free device memory)"
    yield m.offload_ahead >= 1, "memory.offload_ahead", m.offload_ahead, "an integer >= 1"
    spill = m.offload_dir
    allowed = "an existing folder this user can write to (empty = the system's temporary folder)"
    yield not spill or (os.path.isdir(spill) and os.access(spill, os.W_OK)), "memory.offload_dir", spill, allowed
    yield (
        m.name != "microbatch" or per_rank % m.micro_batches == 0,
        "memory.micro_batches",
        m.micro_batches,
        f"a divisor of the per-rank batch {per_rank} (train.batch_size / data-parallel degree)",
    )


def _loader_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    lo = c.loader
    auto = lo.name == "auto"
    yield lo.name in LOADERS, "loader.name", lo.name, f"one of {', '.join(LOADERS)}"
    least = -1 if auto else 0
    yield lo.num_workers >= least, "loader.num_workers", lo.num_workers, "an integer >= 0" + (" or -1 (auto)" * auto)
    least = 0 if auto else 1
    yield (
        lo.prefetch_factor >= least,
        "loader.prefetch_factor",
        lo.prefetch_factor,
        "an integer >= 1" + (" or 0 (auto)" * auto),
    )
    switches = SWITCHES if auto else SWITCHES[1:]
    for key in ("pin_memory", "persistent_workers"):
        value = getattr(lo, key)
        yield str(value).lower() in switches, f"loader.{key}", value, f"one of {', '.join(switches)}"
