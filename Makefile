# Two entry points: `make demo` (set up, then run the main job) and `make test` (set up, then test).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: setup test demo bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# llama-cpp-python builds llama.cpp from source the first time (about 6 minutes on 2 cores)
	$(BIN)/python -m pip install -q -e '.[dev,train]'
	touch $@

setup: $(BIN)/.installed

test: setup
	$(BIN)/python -m pytest

demo: setup
	$(BIN)/mtp-cli generate

bench: setup
	$(BIN)/python benchmarks/pack_bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
