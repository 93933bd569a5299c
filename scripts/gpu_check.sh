#!/usr/bin/env bash
# make gpu-check: every GPU claim of fwk checked in one command (python -m benchmarks.gpu), at
# most 8 minutes on one GPU, each part on its own budget; the report goes to bench/gpu/.
#
#   bash scripts/gpu_check.sh [--dry] [--out DIR] [--only PART,...]
#
# On a GPU machine without internet, the packages fwk needs and the machine lacks come from
# wheels/ (`make gpu-wheels`, built where pip can download), installed into a folder of their
# own on PYTHONPATH with --no-deps: nothing is downloaded, and the machine's torch stays.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
# found, not imported: importing torch_pruning and litdata imports torch (~3 s of CPU per check)
if ! "$PY" -c "import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ('hydra', 'omegaconf', 'torch_pruning', 'litdata', 'schedulefree', 'boto3')))"
then
  if ! ls wheels/*.whl >/dev/null 2>&1; then
    echo "gpu-check: $PY lacks fwk's packages (hydra-core, omegaconf, torch-pruning, litdata, schedulefree, boto3)" \
         "and wheels/ holds none; run make gpu-wheels where pip can download, and bring wheels/ along" >&2
    exit 2
  fi
  site="${TMPDIR:-/tmp}/fwk-gpu-site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" wheels/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # fwk and benchmarks from this checkout: conf/ and recipes/ beside it
exec "$PY" -m benchmarks.gpu "$@"
