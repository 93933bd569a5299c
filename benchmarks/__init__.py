"""fwk's benchmarks: each a ratio of fwk against plain PyTorch, measured side by side in one run.

``python -m benchmarks`` (``make bench``) runs every group through the harness
(``benchmarks/harness.py``), each in a child process with a time budget, and prints one
table. A group's module can also run alone, ``python -m benchmarks.precision --help``, and
``benchmarks.gpu`` holds ``make gpu-check``: the same benchmarks at GPU sizes, with the
checks that need CUDA. The fwk package never imports this one.
"""
