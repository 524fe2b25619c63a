# `make demo` (set up, then run the main job), `make test` (set up, then test) and `make check`
# (set up, then lint, type-check and test: what CI runs).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: setup test check lint typecheck demo bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# llama-cpp-python builds llama.cpp from source the first time (about 6 minutes on 2 cores)
	$(BIN)/python -m pip install -q -e '.[dev,train,serve]'
	touch $@

setup: $(BIN)/.installed

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

check: lint typecheck test

demo: setup
	$(BIN)/mtp-cli generate

bench: setup
	$(BIN)/python benchmarks/pack_bench.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
