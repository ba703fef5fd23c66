# Two entry points for a fresh machine with Python >= 3.10 and a Rust toolchain:
#   make simulate   the main job (the scheduler simulator's default run)
#   make test       builds, then runs every check and test: lints, cargo's tests, pytest's,
#                   and last the abi3 check, which also needs CPython 3.10 and 3.13
#                   (pyenv install --skip-existing 3.10 3.13)
# Everything is installed into ./.venv (and .venv-3.10, .venv-3.13 for the
# abi3 checks) by these targets.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
export VIRTUAL_ENV := $(abspath $(VENV))

WHEELS := target/wheels
# The one abi3 wheel is also tested on these CPythons (pyenv's, or pythonX.Y on PATH).
OTHER_PYTHONS ?= 3.10 3.13
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $$HOME/.pyenv)
# What the other CPythons run: the API, the differential tests and the seed regressions.
ABI3_TESTS := tests/test_manager_api.py tests/test_bad_input.py tests/test_differential.py \
	tests/test_step_differential.py tests/test_seed_regressions.py tests/test_stubs.py tests/test_host_tier.py

.PHONY: build wheel test lint abi3 simulate bench

$(VENV)/bin/maturin:
	@echo "creating $(VENV) and installing maturin..."
	@python3 -m venv $(VENV)
	@$(PIP) install --upgrade pip
	@$(PIP) install 'maturin>=1.5,<2'

# The extension (release, abi3, profile-guided) built into $(VENV) with the test dependencies
# and the test hooks (cargo feature test-hooks: `_CallFloor`, `_panic_for_test`), which the
# wheel below leaves out; the Python sources stay editable. tools/build_extension.sh builds
# it instrumented, runs tools/pgo_train.py on it and builds it again with that profile.
# Build output goes to target/build.log.
build: $(VENV)/bin/maturin
	@echo "building the extension (release, profile-guided; a first build takes 3 to 5 minutes)..."
	@mkdir -p target && rm -f python/encoder_cache/_core.cpython-*.so  # an older non-abi3 build would shadow it
	@tools/build_extension.sh develop
	@echo "installed $$($(PY) -c 'import encoder_cache as e, encoder_cache._core as c, os; print(e.__name__, e.__version__, os.path.basename(c.__file__))')"

# The one abi3 wheel (profile-guided too, trained on an instrumented wheel of its own), for
# the other CPythons.
wheel: build
	@tools/build_extension.sh wheel $(WHEELS)

lint: build
	cargo fmt --check
	cargo clippy --quiet --all-targets --all-features -- -D warnings
	$(VENV)/bin/ruff format --check --quiet python tests benches tools
	$(VENV)/bin/ruff check --quiet python tests benches tools
	$(PY) -m mypy.stubtest encoder_cache._core

# The same wheel, imported and tested on the other CPythons.
define test_other_pythons
	@missing=; for v in $(OTHER_PYTHONS); do \
		ls -d $(PYENV_ROOT)/versions/$$v.*/bin/python$$v >/dev/null 2>&1 || command -v python$$v >/dev/null || missing="$$missing $$v"; \
	done; \
	[ -z "$$missing" ] || { \
		echo "CPython$$missing not found: the abi3 check also tests the wheel on each of CPython $(OTHER_PYTHONS),"; \
		echo "taken from pyenv ($(PYENV_ROOT)/versions) or as pythonX.Y on PATH. Install them with"; \
		echo "    pyenv install --skip-existing$$missing"; \
		echo "(pyenv: https://github.com/pyenv/pyenv#installation), then run 'make abi3'."; \
		exit 1; }
	@for v in $(OTHER_PYTHONS); do \
		py=$$(ls -d $(PYENV_ROOT)/versions/$$v.*/bin/python$$v 2>/dev/null | tail -n 1); \
		[ -n "$$py" ] || py=$$(command -v python$$v); \
		[ -x .venv-$$v/bin/python ] || $$py -m venv .venv-$$v || exit 1; \
		echo "CPython $$v ($$py): $(ABI3_TESTS)"; \
		.venv-$$v/bin/python -m pip --disable-pip-version-check -q install "$$(ls $(WHEELS)/*.whl)[test]" || exit 1; \
		.venv-$$v/bin/python -m pip --disable-pip-version-check -q install --force-reinstall --no-deps $(WHEELS)/*.whl || exit 1; \
		.venv-$$v/bin/python -c "import encoder_cache._core as c; assert c.__file__.endswith('_core.abi3.so'), c.__file__" || exit 1; \
		.venv-$$v/bin/python -m pytest -q -p no:cacheprovider $(ABI3_TESTS) || exit 1; \
	done
endef

abi3: wheel
	$(test_other_pythons)

# The main suite first, so a machine without the other CPythons still runs it.
test: lint wheel
	cargo test --quiet
	$(PY) -m pytest -q
	$(test_other_pythons)

simulate: build
	@$(PY) -m encoder_cache simulate

# Benches are plain tests elsewhere (pyproject sets --benchmark-disable); here they are timed.
# The warm-up matters: pytest-benchmark sizes a round from its first timings, and a first call
# slowed by code not yet paged in would fix every round at one call, which a timer's resolution
# then dominates (a 65 ns method read 130 to 160 ns so).
bench: build
	mkdir -p .benchmarks
	ENCODER_CACHE_FETCH_VLLM=1 $(PY) benches/vllm_baseline.py
	$(PY) -m pytest benches -q --benchmark-enable --benchmark-only --benchmark-group-by=group \
		--benchmark-warmup=on --benchmark-warmup-iterations=1000 \
		--benchmark-columns=min,median,mean,rounds --benchmark-sort=name --benchmark-json=.benchmarks/latest.json
	$(PY) benches/report.py .benchmarks/latest.json
