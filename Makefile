# Every target creates .venv when it is missing and installs what it needs.
# torch is installed first, pinned to the CPU build, so that no later step pulls a CUDA build.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=

# Four sets, each a stamp in .venv, each on top of the one before:
#   demo:    the core, torch (CPU build) and matplotlib: what `make demo` and `make docs-figures` use;
#   test:    the `test` extra: the edges the default tests cover (keras on the torch backend,
#            lmdb, remote) and the independent implementations they check stoker against
#            (tfrecord, webdataset, moto's S3 server, torchdata) and `build` (`make wheel-check`);
#   interop: the `interop` extra: TensorFlow (Keras's other backend), Lightning and Ray, for the
#            tests marked `interop` (`make test-interop`);
#   lint:    ruff, mypy and import-linter (the `lint` extra), over the test set so that mypy sees
#            the same packages the tests import.
DEMO_STAMP := $(VENV)/.stoker-demo
TEST_STAMP := $(VENV)/.stoker-test
INTEROP_STAMP := $(VENV)/.stoker-interop
LINT_STAMP := $(VENV)/.stoker-lint
DEMO_EXTRAS := torch,plot
TEST_EXTRAS := $(DEMO_EXTRAS),test
# the default run's wall-clock budget in seconds (tests/conftest.py fails the run past it)
TEST_BUDGET ?= 360
INTEROP_BUDGET ?= 300
# the tests start many Python processes (workers, CLI runs, ranks): let them keep the compiled
# modules (in the ignored __pycache__/) rather than compile stoker and the tests again in each
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-interop test-slow bench lint wheel-check docs-figures clean venv

venv: $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[$(DEMO_EXTRAS)]"
	touch $@

$(TEST_STAMP): $(DEMO_STAMP)
	$(PY) -m pip install -q -e ".[$(TEST_EXTRAS)]"
	touch $@

$(INTEROP_STAMP): $(TEST_STAMP)
	$(PY) -m pip install -q -e ".[$(TEST_EXTRAS),interop]"
	touch $@

$(LINT_STAMP): $(TEST_STAMP)
	$(PY) -m pip install -q -e ".[$(TEST_EXTRAS),lint]"
	touch $@

demo: $(DEMO_STAMP)
	$(PY) scripts/demo/run.py

# the default run: neither `slow` nor `interop`, within TEST_BUDGET seconds: two test processes
# side by side (pytest-xdist), then the tests marked `alone` by themselves, collected from the
# files tests/run_gates.py names alone (from the whole tree when PYTEST_ARGS is given)
DEFAULT := not slow and not interop
test: $(TEST_STAMP)
	t0=$$(date +%s) && \
	$(PY) -m pytest -q -n 2 --dist worksteal -m "$(DEFAULT) and not alone" --time-budget $(TEST_BUDGET) --budget-since $$t0 $(PYTEST_ARGS) && \
	$(PY) -m pytest -q -m "$(DEFAULT) and alone" --time-budget $(TEST_BUDGET) --budget-since $$t0 $(PYTEST_ARGS) $(if $(PYTEST_ARGS),,$$($(PY) tests/run_gates.py))

# what needs TensorFlow, Lightning or a Ray cluster
test-interop: $(INTEROP_STAMP)
	$(PY) -m pytest -q -m "interop and not slow" --time-budget $(INTEROP_BUDGET) $(PYTEST_ARGS)

test-slow: $(INTEROP_STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

bench: $(TEST_STAMP)
	$(PY) bench/run_all.py $(BENCH_ARGS)

lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check src tests bench scripts examples
	$(VENV)/bin/ruff format --check src tests bench scripts examples
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) scripts/check_size.py
	$(PY) scripts/check_cycles.py
	$(PY) scripts/line_budget.py

# builds the wheel and sdist, installs the wheel with its core dependencies only into a fresh
# venv and packs, loads and inspects a few images with it (scripts/wheel_check.py)
wheel-check: $(TEST_STAMP)
	$(PY) scripts/wheel_check.py

docs-figures: $(DEMO_STAMP)
	$(PY) scripts/make_docs_figures.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info src/stoker/codecs/_region*.so .pytest_cache .mypy_cache .ruff_cache
