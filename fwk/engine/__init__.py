"""The loop every worker runs, and only the loop: a run is built once (``assemble``:
``build_run``, from data and model (``build``) to every part a checkpoint restores
(``state``)), looped (``trainer.train``: one optimizer step is ``step``, evaluation
``evaluate``) and finished (``trainer.finish``). Strategies (``fwk.strategies``) and
components (``fwk.components``) plug in."""
