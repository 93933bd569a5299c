#!/usr/bin/env bash
# make gpu-wheels: wheels/ with the packages fwk needs that the GPU machine lacks, at the
# versions installed here, for its Python (3.12, x86-64 Linux); never torch or its CUDA
# libraries, which the machine keeps. scripts/gpu_check.sh installs them there offline.
#
#   bash scripts/wheels.sh [PYTHON_VERSION]    # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
version="${1:-3.12}"
# What fwk imports in make gpu-check beyond that machine's image (its package list: PyTorch,
# Triton, numpy, scikit-learn, scikit-image, onnx, onnxruntime, typer, rich, ... but none of
# these): the config stack, pruning, schedule-free, streaming (litdata and the S3 client).
packages=(hydra-core omegaconf antlr4-python3-runtime torch-pruning schedulefree litdata obstore boto3 botocore
          s3transfer jmespath)
# Not torchcodec: each release is built for one torch (2.14 here), which that machine does not
# have; fwk decodes there with its torchvision's decoders (fwk/data/codec.py).
rm -rf wheels
mkdir -p wheels
platforms=()
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do platforms+=(--platform "manylinux_${n}_x86_64"); done
for p in "${packages[@]}"; do
  pin="$p==$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$p")"
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
      "${platforms[@]}" --platform manylinux2014_x86_64 --platform any -d wheels "$pin" 2>/dev/null; then
    "$PY" -m pip wheel -q --no-deps -w wheels "$pin"  # a pure-Python sdist (antlr4-python3-runtime 4.9.3)
  fi
done
ls wheels
du -sh wheels
