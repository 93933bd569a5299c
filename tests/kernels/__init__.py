"""The Triton kernels' tests: on a CUDA device where there is one (compiled, as `make
gpu-check` runs them), else on the CPU in Triton's interpreter (tests/conftest.py)."""

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
