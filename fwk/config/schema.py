"""The typed schema of the resolved config: one dataclass per section, a doc per field.

Sections that pick an implementation by name (``model``, ``data``, ``optim``) are typed
by the config dataclass that their registry entry declares, as ``fwk/registry.py`` says.
``validate.py`` applies them. This module imports neither torch nor Hydra.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fwk.config.methods import METHODS, settings_section
from fwk.distributed.dims import NAMES, Dims, layout
from fwk.registry import doc

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "staged")
AMP_DTYPES = ("auto", "bf16", "fp16")
SWITCHES = ("auto", "true", "false")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")
# why fp16 cannot train a sharded model: refused up front for parallel=fsdp/hsdp (config/validate.py)
# and when parallel=auto picks one (strategies/parallel.py)
FP16_SHARDED = "its loss scaler sees only this rank's gradient shard when the model is sharded or split"
MEMORIES = ("none", "checkpoint", "offload", "microbatch", "auto")
JITS = ("auto", "off", "compile")
KERNELS = ("auto", "triton", "torch")
LOADERS = ("auto", "manual")
ON_NAN = ("rollback", "skip", "stop")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DECAYS = ("cosine", "linear", "constant", "wsd")
BACKENDS = ("auto", "gloo", "nccl")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
TRACKINGS = ("tensorboard", "mlflow")

MethodConfig = settings_section()  # one field per method file in fwk/methods/


@dataclass
class TrainConfig:
    """The training loop: how long, how big, how often to evaluate and log."""

    max_steps: int = doc(1000, "optimizer steps to train for")
    batch_size: int = doc(64, "global batch size in samples, split evenly across ranks")
    eval_every: int = doc(100, "evaluate every N steps (and at the end); 0 = only at the end")
    eval_batches: int = doc(0, "cap on validation batches per evaluation; 0 = the whole set")
    log_every: int = doc(10, "log loss, lr, samples/s and data-wait fraction every N steps")
    grad_clip: float = doc(0.0, "clip the global gradient norm to this value; 0 = off")
    accum_steps: int = doc(1, "loader batches whose gradients are summed into one optimizer step (1 = none)")
    accum_lr: str = doc(
        "sqrt",
        "with train.accum_steps set on the command line to other than the recipe's: sqrt scales optim.lr "
        "by sqrt(new/recipe's), fixed keeps it (an optim.lr on the command line is never scaled)",
    )
    device: str = doc("auto", "'auto' (cuda if available, else cpu), 'cpu' or 'cuda'")
    stop_at: str = doc(
        "",
        "end the run at the first evaluation that reaches this target (val_acc>=0.985, val_loss<=1.7); "
        "summary.json records the step and the time it took; empty = train all max_steps",
    )
    early_stop_patience: int = doc(
        0, "end the run after this many evaluations in a row without a new best checkpoint.best; 0 = off"
    )
    deterministic: bool = doc(
        False,
        "deterministic kernels (torch.use_deterministic_algorithms, cuDNN/cuBLAS settings) and no decisions "
        "from measured step times (jit=auto stays eager), so `fwk replay` can match a GPU run exactly",
    )


@dataclass
class ScheduleConfig:
    """The learning-rate schedule (group ``schedule``): linear warmup, then decay to min_lr_ratio * lr."""

    warmup_steps: int = doc(0, "steps of linear warmup from 0 to optim.lr")
    decay: str = doc("cosine", "decay after warmup: cosine, linear, constant, or wsd (stable, then a linear cooldown)")
    min_lr_ratio: float = doc(0.0, "final lr as a fraction of optim.lr")
    cooldown_frac: float = doc(0.4, "wsd: the share of train.max_steps at the end over which the lr cools down")


@dataclass
class LoaderConfig:
    """The DataLoader settings shared by every data set (fwk/data/loader_plan.py).

    A value left at auto is decided per rank from the cores, the device and the data set. A
    value set wins."""

    name: str = doc("auto", "auto (unset values decided, one log line says why) or manual (every value given)")
    num_workers: int = doc(
        -1,
        "DataLoader worker processes per rank; 0 = load in the main process; -1 = auto (0 for in-memory "
        "data, else the cores per rank, minus one for the training process, or all: the faster measured)",
    )
    pin_memory: str = doc("auto", "pin host memory for faster copies to the GPU: auto (on with CUDA), true, false")
    prefetch_factor: int = doc(
        0, "batches each worker loads ahead (only with num_workers > 0); 0 = auto (at least 4 batches queued)"
    )
    persistent_workers: str = doc(
        "auto",
        "keep the worker processes from one epoch (and evaluation) to the next: auto (on with workers), true, false",
    )


@dataclass
class CheckpointConfig:
    """The settings of when checkpoints are written and how many are kept."""

    every: int = doc(0, "save every N steps; 0 = only at the end (and on interrupt)")
    keep: int = doc(2, "keep the last K checkpoints; older ones are deleted")
    on_corrupt: str = doc(
        "fallback", "a corrupt newest checkpoint: fallback (resume from the newest intact one, warn) or error"
    )
    rewind_at: float = doc(
        0.02, "save the model's weights once at this share of train.max_steps (lottery-ticket rewinding); 0 = off"
    )
    best: str = doc(
        "", "keep the best checkpoint by this evaluation metric in checkpoints-best/ (val_acc, val_loss); empty = off"
    )
    min_improvement: float = doc(0.0, "best: a new best is saved when it beats the saved one by at least this much")
    patience: int = doc(
        0, "best: also save a smaller improvement after this many evaluations without a saved one; 0 = never"
    )


@dataclass
class PrecisionConfig:
    """The numeric precision settings: autocast format, fp32 islands, loss scaling, staged phases."""

    name: str = doc(
        "auto", "auto (measured: the hardware's fast format if it beats fp32), fp32, bf16, fp16 (loss scaling), staged"
    )
    keep_fp32: list[str] = doc(
        [], "modules that always run in fp32 under autocast: globs on named_modules() names, or type names"
    )
    channels_last: str = doc("auto", "channels-last memory format: auto (on with AMP on conv nets), true, false")
    dtype: str = doc("auto", "staged: the format of the main phase, auto (from the hardware), bf16 or fp16")
    warmup_frac: float = doc(0.05, "staged: fraction of train.max_steps run in fp32 first")
    warmup_steps: int = doc(0, "staged: fp32 warm-up length in steps; > 0 overrides warmup_frac")
    final_frac: float = doc(0.05, "staged: fraction of train.max_steps at the end in which final_fp32 runs in fp32")
    final_fp32: list[str] = doc([], "staged: patterns back in fp32 in the final phase; empty = the last Linear layer")
    init_scale: float = doc(65536.0, "fp16: initial loss scale")
    growth_factor: float = doc(2.0, "fp16: the loss scale is multiplied by this after growth_interval clean steps")
    backoff_factor: float = doc(0.5, "fp16: the loss scale is multiplied by this when a step has inf/NaN gradients")
    growth_interval: int = doc(2000, "fp16: clean steps in a row before the loss scale grows")
    probe_steps: int = doc(
        10, "auto, where fp16 may run: first steps in which per-module value ranges are recorded (in fp32)"
    )
    fp16_headroom: float = doc(
        16.0, "auto: under fp16, modules whose largest |value| exceeds 65504 / this join keep_fp32"
    )
    trial_steps: int = doc(
        3, "auto: timed steps of fp32 and of the hardware's fast format, interleaved, after the range probe"
    )
    min_speedup: float = doc(1.05, "auto: the fast format is kept only when this much faster than fp32 per step")
    max_trial_share: float = doc(
        0.05, "auto: time the formats only if the probe and trial steps, run twice, are at most this share of the run"
    )


@dataclass
class AdaptConfig:
    """The communication monitor: adapt DDP when ranks wait on collectives too long."""

    enabled: bool = doc(
        False, "adapt DDP when the wait stays high (changes numerics: compression, bigger effective batch)"
    )
    threshold: float = doc(0.15, "share of step time spent waiting on collectives that counts as high")
    windows: int = doc(2, "consecutive logging windows above the threshold before adapting")
    max_bucket_mb: float = doc(200.0, "largest DDP bucket the adaptation grows to")
    max_accum_steps: int = doc(8, "largest gradient accumulation the adaptation raises train.accum_steps to")


@dataclass
class ParallelConfig:
    """The settings of how many processes train and how they talk, which are torchrun's."""

    name: str = doc(
        "auto",
        "the preset that set the degrees below: none, ddp, fsdp, hsdp, tp, pp, hybrid, or auto "
        "(replicate or shard the data dimension, decided from measured memory)",
    )
    pp: int = doc(1, "pipeline stages; -1 takes the processes the other degrees leave")
    dp_replicate: int = doc(1, "model replicas (DDP; HSDP's groups with dp_shard > 1); -1 takes what is left")
    dp_shard: int = doc(1, "FSDP shards of each replica; -1 takes what is left, 0 = one machine's processes")
    tp: int = doc(1, "tensor-parallel ranks (inside one machine); -1 takes what is left")
    pp_schedule: str = doc("1f1b", "pp: gpipe, 1f1b, interleaved_1f1b or zero_bubble (interleaved zero-bubble)")
    pp_microbatches: int = doc(0, "pp: micro-batches each stage runs per batch; 0 = 2 x the stage count")
    pp_stages_per_rank: int = doc(1, "pp: stages each rank holds (interleaved_1f1b, zero_bubble: at least 2)")
    nproc_per_node: int = doc(1, "worker processes on each machine (GPUs per node on CUDA)")
    nnodes: int = doc(1, "number of machines (the most, with min_nnodes); parallel.nnodes=MIN:MAX sets both")
    min_nnodes: int = doc(0, "elastic: fewest machines the run goes on with when others die (0 = nnodes: no range)")
    rdzv_last_call_s: int = doc(30, "elastic: seconds the rendezvous waits for more machines once min_nnodes joined")
    node_rank: int = doc(0, "this machine's rank, 0..nnodes-1 (ignored with rdzv_backend=c10d)")
    rdzv_backend: str = doc("c10d", "torchrun rendezvous backend (c10d or static)")
    rdzv_endpoint: str = doc("localhost:29500", "host:port of the rendezvous (node 0) for multi-node runs")
    backend: str = doc("auto", "process-group backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl")
    collective_timeout_s: int = doc(600, "seconds a collective waits on a dead machine; then fail, or go on (elastic)")
    find_unused_parameters: bool = doc(False, "let DDP tolerate parameters that get no gradient")
    bucket_cap_mb: float = doc(25.0, "DDP: gradient bucket size in MB (bigger: fewer, larger all-reduces)")
    gradient_as_bucket_view: bool = doc(True, "DDP: gradients are views into the buckets (saves a copy of them)")
    static_graph: bool = doc(False, "DDP: the set of used parameters never changes (enables more overlap)")
    comm_hook: str = doc("none", "DDP gradient communication: none, fp16 / bf16 (compressed), or powersgd")
    powersgd_rank: int = doc(1, "powersgd: rank of the low-rank gradient approximation")
    powersgd_start: int = doc(10, "powersgd: plain all-reduce for this many steps first (>= 2)")
    max_restarts: int = doc(
        0, "torchrun restarts of the worker group after a worker dies (resume from checkpoint); elastic: 0 means 3"
    )
    reshard_after_forward: bool = doc(
        True, "fsdp/hsdp: free gathered parameters after forward (less memory, one more all-gather)"
    )
    shard_size: int = doc(0, "hsdp (dp_shard=0): processes per shard group (0 = one machine's)")
    auto_memory_share: float = doc(
        0.5, "auto: DDP when parameters + gradients + optimizer state fit in this share of free device memory"
    )
    adapt: AdaptConfig = field(default_factory=AdaptConfig, metadata={"doc": "communication monitor"})


@dataclass
class MemoryConfig:
    """The memory-saving strategies: activation checkpointing, offload, micro-batching, auto."""

    name: str = doc("none", "none, checkpoint, offload, microbatch or auto (fastest that fits budget_gb)")
    every: int = doc(1, "checkpoint: checkpoint every k-th block (1 = all of them)")
    modules: list[str] = doc([], "checkpoint: module names (globs) to checkpoint; empty = the model's blocks")
    micro_batches: int = doc(4, "microbatch: split each rank's batch into this many micro-batches")
    budget_gb: float = doc(0.0, "auto: memory budget per process in GB; 0 = free device memory (CUDA only)")
    offload_ahead: int = doc(1, "offload: saved activations brought back ahead of backward's need")
    offload_dir: str = doc("", "offload on CPU: the spill file's folder; empty = the system's temporary folder")


@dataclass
class JitConfig:
    """The JIT layer: torch.compile of the model once its steps are stable."""

    name: str = doc("auto", "auto (compile once stable_steps share one signature), off, or compile (from step 0)")
    mode: str = doc("default", "torch.compile mode: default, reduce-overhead, max-autotune, ...-no-cudagraphs")
    backend: str = doc("inductor", "torch.compile backend (inductor; aot_eager and eager for debugging)")
    stable_steps: int = doc(5, "auto: consecutive steps with one input signature before compiling")
    max_recompiles: int = doc(8, "new signatures compiled after the first; beyond that they run eager")
    min_remaining_s: float = doc(60.0, "auto: compile only if the steps left would take longer eagerly (seconds)")
    trial_steps: int = doc(3, "auto on CPU: compiled steps timed against eager; the faster is kept")
    max_trial_share: float = doc(0.05, "auto on CPU: try compiling only if it costs at most this share of time left")
    min_speedup: float = doc(1.05, "auto on CPU: keep compiled only when this much faster than eager (ties stay eager)")


@dataclass
class AutoConfig:
    """The settings of the measured decisions (precision, memory, jit and loader auto).

    The decisions are cached per machine."""

    cache: bool = doc(
        True,
        "reuse the decisions measured before for this model on this machine ($XDG_CACHE_HOME/fwk/decisions/), "
        "and keep new ones there; false: measure in every run, keep nothing",
    )


@dataclass
class KernelsConfig:
    """The settings of fwk's Triton kernels: LayerNorm/RMSNorm, chunked linear cross-entropy, fused Lion."""

    name: str = doc("auto", "auto (Triton on CUDA, plain PyTorch elsewhere), triton, or torch (plain PyTorch)")


@dataclass
class DiagnosticsConfig:
    """The settings of what happens on a non-finite loss or gradient, or a loss spike.

    fwk/components/diagnostics.py acts on them."""

    name: str = doc("rollback", "name of the option in conf/diagnostics/ (rollback, skip or stop)")
    on_nan: str = doc(
        "rollback",
        "a non-finite loss or gradient: rollback (restore the last snapshot, skip the batch, go on), "
        "skip (drop the batch's update, go on) or stop (exit 1 with one line)",
    )
    snapshot_every: int = doc(50, "rollback: keep the model and optimizer in host memory every N steps")
    lr_factor: float = doc(1.0, "rollback: multiply the learning rate by this after each rollback (1 = unchanged)")
    max_rollbacks: int = doc(3, "rollback / skip: after this many bad steps, stop with one line")
    spike_k: float = doc(0.0, "a loss above mean + k std of the last spike_window losses is a spike; 0 = off")
    spike_window: int = doc(50, "losses the spike detector keeps (it waits until the window is full)")
    grad_stats: bool = doc(False, "log the gradient norm of each top-level module every train.log_every steps")


@dataclass
class TrackingConfig:
    """The settings of where metrics go besides metrics.jsonl (fwk/components/sinks.py).

    They are not in the run id, since they say where results are sent, not what a run computes."""

    name: str = doc("tensorboard", "name of the option in conf/tracking/ (tensorboard, or mlflow: both)")
    tensorboard: bool = doc(True, "write TensorBoard event files to <run dir>/tensorboard/ (tensorboard --logdir runs)")
    mlflow: bool = doc(False, "also send params, metrics and artifacts to the MLflow tracking server at uri")
    uri: str = doc("", "MLflow tracking URI, e.g. http://127.0.0.1:5000 (default: $MLFLOW_TRACKING_URI)")
    experiment: str = doc("", "MLflow experiment the run is logged under; empty = the recipe's name")


@dataclass
class PathsConfig:
    """The settings of where runs live.

    They are not part of the run id, so moving runs does not change it."""

    runs: str = doc("runs", "root folder of run dirs (default: $FWK_RUNS, else ./runs)")


@dataclass
class Config:
    """The whole resolved config, as written to ``runs/<id>/config.yaml``."""

    recipe: str = doc("digits_cnn", "name of the recipe this config was composed from")
    seed: int = doc(0, "seed of model init, data order and augmentation")
    tags: list[str] = doc(
        [],
        "labels to find runs by (tags=[baseline,lr-sweep]); not in the run id: the same training with other "
        "tags is the same run, and keeps the tags of its first launch",
    )
    model: Any = doc({}, "model section: name of a registered model, or _target_ of your own class")
    data: Any = doc({}, "data section: name of a registered data set, or _target_ of your own builder")
    optim: Any = doc({}, "optimizer section: name of a registered optimizer and its settings")
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig, metadata={"doc": "learning-rate schedule"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"doc": "training loop"})
    loader: LoaderConfig = field(default_factory=LoaderConfig, metadata={"doc": "data loading (workers, pinning)"})
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata={"doc": "checkpoints"})
    precision: PrecisionConfig = field(default_factory=PrecisionConfig, metadata={"doc": "numeric precision"})
    parallel: ParallelConfig = field(default_factory=ParallelConfig, metadata={"doc": "processes and parallelism"})
    memory: MemoryConfig = field(default_factory=MemoryConfig, metadata={"doc": "memory strategies"})
    jit: JitConfig = field(default_factory=JitConfig, metadata={"doc": "compilation (torch.compile)"})
    kernels: KernelsConfig = field(default_factory=KernelsConfig, metadata={"doc": "Triton kernels"})
    auto: AutoConfig = field(default_factory=AutoConfig, metadata={"doc": "the cache of measured decisions"})
    methods: list[str] = doc(
        [],
        "speed-up methods the loop applies, in this order: "
        + ", ".join(METHODS.names())
        + " (settings: method.NAME.*)",
    )
    method: MethodConfig = field(default_factory=MethodConfig, metadata={"doc": "each method's settings"})
    diagnostics: DiagnosticsConfig = field(
        default_factory=DiagnosticsConfig, metadata={"doc": "NaN and loss-spike handling, gradient statistics"}
    )
    tracking: TrackingConfig = field(
        default_factory=TrackingConfig, metadata={"doc": "TensorBoard events and the optional MLflow server"}
    )
    paths: PathsConfig = field(default_factory=PathsConfig, metadata={"doc": "where runs are stored"})

    @property
    def world_size(self) -> int:
        return self.parallel.nproc_per_node * self.parallel.nnodes

    def dims(self, world: int | None = None) -> Dims:
        """Return the layout the parallel section asks for on ``world`` processes.

        ``world`` defaults to the launched ``world_size``, which ``fwk/config/validate.py``
        checked. An elastic run that lost a machine has fewer, and degrees that no longer fit
        are one line."""
        dims, problem = layout(self.parallel, self.world_size if world is None else world)
        if dims is None:
            from fwk.errors import UserError

            raise UserError(problem)
        return dims


def one_process(p: ParallelConfig) -> ParallelConfig:
    """Return the parallel section of the same run in one process.

    ``fwk profile`` and ``fwk export``'s retraining use it."""
    import dataclasses

    degrees = dict.fromkeys(NAMES, 1)
    return dataclasses.replace(p, name="none", nproc_per_node=1, nnodes=1, node_rank=0, **degrees)
