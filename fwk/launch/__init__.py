"""From a resolved config to running workers. ``run.py`` is the one launch path (checks ->
plan -> already complete? -> preflight -> launch -> report) that `fwk train`, every sweep
member (``sweep.py``) and `fwk replay` share; ``launcher.py`` plans and opens the run dir;
``worker.py`` is what each rank runs; ``torchrun.py`` and ``supervise.py`` start and watch
torchrun; ``slurm.py`` is the batch job's side; ``report.py`` words the outcome;
``doctor.py`` checks the environment."""
