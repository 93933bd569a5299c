"""``python -m benchmarks.gpu``: the GPU check (check.py), every part or those of ``--only``."""

import sys

from benchmarks.gpu.check import main

sys.exit(main())
