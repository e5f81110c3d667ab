# Quick start: `make demo` (offline demo pipeline) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
PRESET ?= demo
# The demo and the tests never touch the hub: make any attempt fail at once.
ifeq ($(PRESET),demo)
export HF_HUB_OFFLINE ?= 1
endif
CORES ?= all

.PHONY: audit demo lock test test-seeds test-slow test-slurm test-all bench gpu-check gpu-check-run gpu-profile gpu-paper-prepare gpu-wheels gpu-paper-window gpu-concurrency plan lint clean

# Exactly the versions CI tested: constraints.txt (make lock). torch from PyPI: a CPU build here, the
# same version built for CUDA on a GPU machine (docs/scale/gpu.md).
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,slurm,eval,tensorboard,wandb,mlflow]"  # slurm: the docs test plans the SLURM command as written; eval: tests/lm/test_harness.py; tensorboard, wandb, mlflow: tests/core/test_trackers.py
	touch $@

# constraints.txt anew: the newest versions pyproject.toml allows, resolved in a fresh venv, frozen
# (torch's local label dropped: the pin then holds for its CPU and CUDA builds alike), and the newest
# CuPy for each CUDA major (the gpu-cuda12/13 extras, installed by gpu-check with these pins; not
# installed here: its CUDA libraries are GBs). Commit it once `make test` passes with it (docs/develop/development.md).
LOCK_VENV := .lock-venv
lock:
	rm -rf $(LOCK_VENV) && python3 -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q torch
	$(LOCK_VENV)/bin/python -m pip install -q -e ".[dev,slurm,eval,tensorboard,wandb,mlflow]"
	{ echo "# Every dependency at the version CI tests (make lock regenerates; pip install -c constraints.txt ...)."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | sed -E 's/^(torch==[^+]+)\+.*/\1/'; \
	  for c in cupy-cuda12x cupy-cuda13x; do \
	    $(LOCK_VENV)/bin/python -m pip index versions $$c 2>/dev/null | sed -nE "1s/^($$c) \(([^)]+)\)$$/\1==\2/p"; \
	  done; } > constraints.txt
	rm -rf $(LOCK_VENV)

demo: $(VENV)/.installed
	snakemake --cores $(CORES) --config preset=$(PRESET)
	mkdir -p reports/$(PRESET)
	snakemake --cores $(CORES) --config preset=$(PRESET) --report reports/$(PRESET)/report.zip
	@echo "Tables and figures: results/$(PRESET)/report/  (summary.md; SNLI: snli_summary.md)"
	@echo "Browsable report:   reports/$(PRESET)/report.zip"

# The default tier (≤ 5 min on 2 cores; the slowest tests listed; the tests that read the finished demo are slow). CI runs every tier but the GPU's in
# one session, so that the demo the pipeline tests share is built once: make test TIERS="not gpu".
# WORKERS pytest-xdist processes (tests/conftest.py schedules them: the demo's tests on one, the SLURM
# tests on one, of their own where the workers outnumber the cores, each other file on one); WORKERS=0
# runs them in this process.
TIERS ?= not slow and not gpu and not slurm
WORKERS ?= 2
test: $(VENV)/.installed
	$(PY) -m pytest -q --durations=25 -m "$(TIERS)" -n $(WORKERS)

# The randomized tests (those drawing from `gen`) under N fresh seeds and the regression seeds
# (tests/regression_seeds.txt), with each test's worst margin (error / tolerance) at the end.
# ~11 s per seed on 2 cores. Replay one seed: GRASSFLOW_TEST_SEED=<seed> pytest <test>.
N ?= 200
test-seeds: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider --seeds $(N)

# The slow tests: real text from ../shared (skipped without it), and the longest DAG runs and kill
# tests (the docs' commands, the toy fourth task, the SIGKILLed pipeline, ...), out of `make test`.
test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow

# A real single-node SLURM (tests/slurm/start.sh installs Debian's packages as root) runs the
# demo through profiles/slurm; skipped where SLURM cannot be installed.
test-slurm: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[slurm]"
	$(PY) -m pytest -q -m slurm

test-all: $(VENV)/.installed
	$(PY) -m pytest -q -m "slow or not slow"

bench: $(VENV)/.installed
	$(PY) -m grassflow.bench --out reports/bench

# What the first user with a GPU runs first: the GPU tests, the preflight of this machine (its
# record: reports/bench/preflight-cuda.json), and the benchmark (reports/bench/bench-cuda.md).
# It installs the CuPy extra of torch's CUDA major (gpu-cuda12, gpu-cuda13).
gpu-check: $(VENV)/.installed
	@major=$$($(PY) -c 'import torch; print((torch.version.cuda or "").split(".")[0])'); \
	  if [ -z "$$major" ]; then echo "error: torch $$($(PY) -c 'import torch; print(torch.__version__)') is a CPU build: install torch for CUDA 12 or 13 first (docs/scale/gpu.md)"; exit 1; fi; \
	  echo "$(PY) -m pip install -c constraints.txt -e .[gpu-cuda$$major]"; $(PY) -m pip install -q -c constraints.txt -e ".[gpu-cuda$$major]"
	$(MAKE) gpu-check-run PY=$(PY)

# The same without installing, for a machine whose Python already holds torch (CUDA) and CuPy:
#   make gpu-check-run PY=python3 PYTHONPATH=src
gpu-check-run:
	$(PY) -m pytest -q -p no:cacheprovider -m gpu
	$(PY) -m grassflow preflight --device cuda --backend auto cupy fast --snli --out reports/bench/preflight-cuda.json
	$(PY) -m grassflow.bench --device cuda --out reports/bench

# One GPU lease, the paper's Tables 1 and 2 (bench/gpu_paper_window.sh): commit, prepare on any machine
# (gpu-paper-prepare: paper_v1's token files and the commit's tree; gpu-wheels: what the GPU machine
# lacks), carry .gpu-carry.tar and .whl, then run gpu-paper-window there (again at once, to resume).
# (bench/gpu_paper_prepare.sh: the tar keeps the file times and Snakemake's records a copy would lose)
gpu-paper-prepare: $(VENV)/.installed
	PY=$(PY) bash bench/gpu_paper_prepare.sh

gpu-wheels: $(VENV)/.installed
	PY=$(PY) bash bench/gpu_wheels.sh

gpu-paper-window:
	PY=$(PY) bash bench/gpu_paper_window.sh

# One training step of each model under torch.profiler, eager and as one CUDA graph: the top kernels
# by GPU time, kernels per step, the host's share (reports/bench/profile-cuda*.md).
gpu-profile:
	$(PY) -m grassflow.bench --device cuda --profile --compile auto --out reports/bench
	$(PY) -m grassflow.bench --device cuda --profile --compile graph --name profile-graph-cuda --out reports/bench

# On a GPU: K = 1, 2, 4, 8 Table 1 runs side by side, without and with MPS (reports/bench/concurrency-cuda.*):
# what train.runs_per_gpu's default is to be set from.
gpu-concurrency:
	$(PY) -m grassflow.bench --device cuda --concurrency 1,2,4,8 --mps --out reports/bench

# What a preset will do and cost before it runs: jobs per rule and partition, device-hours, memory
plan: $(VENV)/.installed
	$(PY) -m grassflow plan --preset $(PRESET)

# Known vulnerabilities in the installed environment (pip-audit asks PyPI's advisory database:
# needs the network, so CI does not run it).
audit: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[audit]"
	$(VENV)/bin/pip-audit --skip-editable

# ruff (lint and format) and snakefmt (.pre-commit-config.yaml) over every tracked file; CI runs it
# before the tests: unformatted code fails it
lint: $(VENV)/.installed
	$(VENV)/bin/pre-commit run --all-files --show-diff-on-failure

clean:
	rm -rf results .snakemake
