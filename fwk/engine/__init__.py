"""The loop every worker runs, and only the loop.

A run is built once by ``assemble``'s ``build_run``, from data and model (``build``) to every
part a checkpoint restores (``state``). It is looped by ``trainer.train``, where one optimizer
step is ``step`` and evaluation is ``evaluate``, and finished by ``trainer.finish``. Strategies
(``fwk.strategies``) and components (``fwk.components``) plug in."""
