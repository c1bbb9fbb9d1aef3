# Every target creates .venv when it is missing and installs what it needs.
# torch is installed first, pinned to the CPU build, so that no later step pulls a CUDA build.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.stoker-installed
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test test-slow bench lint docs-figures clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,torch,keras,plot]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo/run.py

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run_all.py $(BENCH_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench scripts examples
	$(VENV)/bin/ruff format --check src tests bench scripts examples
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) scripts/check_size.py

docs-figures: $(STAMP)
	$(PY) scripts/make_docs_figures.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
