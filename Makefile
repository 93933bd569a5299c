# `make train` and `make test` set everything up on a fresh machine, then run.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Pinned here, not in pyproject.toml: these builds lie on this machine's disk (a CUDA
# build that also runs on CPU); GPU machines keep the torch they have.
TORCH  := torch==2.14.1 torchvision==0.29.1
STAMP  := $(VENV)/.installed

.PHONY: setup train test lint docs clean slurm bench gpu-check gpu-wheels

setup: $(STAMP)

# Re-runs only when pyproject.toml or this file changes: `make test` is fast when set up.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch, torchvision" 2>/dev/null || $(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

train: setup
	$(BIN)/fwk train

test: setup lint
	@if [ "$$CI" = true ]; then bash scripts/slurm/cluster.sh install; fi
	$(BIN)/python -m pytest -q

# Every benchmark in one run: one markdown table on stdout, a new bench/results/<date>-<time>-<cpu>.json
# (the benchmarks package, benchmarks/harness.py; 45 min to over 2 hours on 2 CPU cores).
# BENCH_ARGS="--quick" for a smoke test, BENCH_ARGS="--only overhead,auto" for some groups.
bench: setup
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# Every GPU claim in one command on a GPU machine (scripts/gpu_check.sh runs python -m
# benchmarks.gpu; at most 8 minutes on one GPU): report in bench/gpu/<date>-<gpu>.md and .json.
# No setup: that machine keeps its own torch; what it lacks comes from wheels/ (make gpu-wheels,
# here, with scripts/wheels.sh). GPU_CHECK_ARGS="--dry" runs every part on the CPU at tiny sizes
# (make test does).
gpu-check:
	bash scripts/gpu_check.sh $(GPU_CHECK_ARGS)

gpu-wheels: setup
	bash scripts/wheels.sh

# The documentation site on http://127.0.0.1:8000, rebuilt as pages change (make test builds it
# with --strict: tests/docs/test_site.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

lint: setup
	$(BIN)/ruff check fwk tests benchmarks docs

# slurm-wlm and munge for the SLURM tests (apt-get, as root; nothing to do when installed).
# The tests start and stop their own single-node cluster (scripts/slurm/cluster.sh).
slurm:
	bash scripts/slurm/cluster.sh install

clean:
	rm -rf $(VENV) runs site .pytest_cache
