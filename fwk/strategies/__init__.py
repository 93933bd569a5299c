"""How the model runs: one module per config group that changes it (``precision``,
``memory``, ``jit``, ``kernels``, ``parallel`` with ``ddp`` and ``fsdp``),
the probes they decide from (``hardware``, ``ranges``), and ``parallelize``: the one place
that applies them, in one fixed order. Each strategy is a small object: it decides, wraps
the model, is called at fixed points of a step, and keeps its state in the checkpoint."""
