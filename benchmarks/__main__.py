"""``python -m benchmarks``: the harness (benchmarks/harness.py), every group or those of ``--only``."""

from benchmarks.harness import main

main()
