# Quick start: `make demo` (offline demo pipeline) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE ?= 1
PRESET ?= demo
CORES ?= all

.PHONY: demo test test-all paper report bench lint clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

demo: $(VENV)/.installed
	snakemake --cores $(CORES) --config preset=$(PRESET)
	mkdir -p reports/$(PRESET)
	snakemake --cores $(CORES) --config preset=$(PRESET) --report reports/$(PRESET)/report.zip
	@echo "Tables and figures: results/$(PRESET)/report/  (summary: results/$(PRESET)/report/summary.md)"
	@echo "Browsable report:   reports/$(PRESET)/report.zip"

test: $(VENV)/.installed
	$(PY) -m pytest -q

test-all: $(VENV)/.installed
	$(PY) -m pytest -q -m "slow or not slow"

bench: $(VENV)/.installed
	$(PY) -m grassflow.bench --out reports/bench

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf results .snakemake
