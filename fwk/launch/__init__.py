"""From a resolved config to running workers.

``run.py`` is the one launch path that `fwk train`, every sweep member (``sweep.py``) and
`fwk replay` share: checks -> plan -> already complete? -> preflight -> launch -> report.
``launcher.py`` plans and opens the run dir, and ``worker.py`` is what each rank runs.
``torchrun.py`` and ``supervise.py`` start and watch torchrun. ``slurm.py`` is the batch job's
side, ``outcome.py`` words the outcome, and ``doctor.py`` checks the environment."""
