# Two entry points for a fresh machine with Python >= 3.10 and a Rust toolchain:
#   make simulate   the main job (the scheduler simulator's default run)
#   make test       builds, then runs every test: cargo's and pytest's
# Everything is installed into ./.venv by these targets.

VENV ?= .venv
PY := $(VENV)/bin/python
export VIRTUAL_ENV := $(abspath $(VENV))

.PHONY: build test simulate bench

$(VENV)/bin/maturin:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q 'maturin>=1.5,<2'

build: $(VENV)/bin/maturin
	$(VENV)/bin/maturin develop --release --extras test --quiet

test: build
	cargo test --quiet
	$(PY) -m pytest -q

simulate: build
	$(PY) -m encoder_cache simulate

# Benches are plain tests elsewhere (pyproject sets --benchmark-disable); here they are timed.
bench: build
	mkdir -p .benchmarks
	$(PY) -m pytest benches -q --benchmark-enable --benchmark-only --benchmark-group-by=group \
		--benchmark-columns=min,median,mean,rounds --benchmark-sort=name --benchmark-json=.benchmarks/latest.json
	$(PY) benches/report.py .benchmarks/latest.json
