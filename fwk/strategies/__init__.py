"""How the model runs: the strategies that change it, the probes they decide from, and the one place that applies them.

There is one module per config group that changes the model: ``precision``, ``memory``, ``jit``,
``kernels``, and ``parallel`` with ``ddp`` and ``fsdp``. The probes are ``hardware`` and
``ranges``. ``parallelize`` is the one place that applies the strategies, in one fixed order.
Each strategy is a small object: it decides, wraps the model, is called at fixed points of a
step, and keeps its state in the checkpoint."""
