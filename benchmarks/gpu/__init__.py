"""``make gpu-check``: every GPU claim of fwk checked in one command, each part on a budget.

``python -m benchmarks.gpu`` runs the parts (parts.py) through the driver (check.py). The
speed parts are the package's benchmarks at GPU sizes, and the modules here hold the ones
that only a GPU machine runs: the whole command against a plain AMP loop (whole.py,
plain_amp.py), DDP against FSDP (ddp_fsdp.py), the NCCL layouts (layouts.py), and a
benchmark's rows as a table (bench_rows.py). The correctness parts run the CUDA tests of
tests/gpu/ with pytest.
"""
