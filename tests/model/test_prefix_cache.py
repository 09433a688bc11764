"""The prefix cache on its own: longest prefixes found, its byte cap held, least recently used out first."""

from __future__ import annotations

import numpy as np
import torch

from retrieval_draft.model.prefix_cache import PrefixCache, weights_signature
from tests.conftest import make_tiny_llama

LAYERS, HEADS, DIM = 3, 2, 8
ROW_BYTES = 2 * LAYERS * HEADS * DIM * 4  # keys and values, float32


def rows(tokens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Fake KV rows of the right shapes, each position's value its token (to check which rows come back)."""
    n = tokens.shape[0]
    keys = torch.from_numpy(tokens.astype(np.float32))[None, None, :, None].expand(LAYERS, HEADS, n, DIM).clone()
    return keys, -keys


def test_the_longest_shared_prefix_is_found_and_capped_at_the_limit():
    cache = PrefixCache(10**6)
    a, b = np.arange(10, 30), np.concatenate([np.arange(10, 20), np.arange(50, 60)])
    cache.store(a, *rows(a))
    cache.store(b, *rows(b))
    query = np.concatenate([np.arange(10, 25), [7, 8]])
    entry, count = cache.find(query, limit=query.shape[0] - 1)
    assert count == 15 and np.array_equal(entry.tokens, a)
    assert torch.equal(entry.keys[0, 0, :count, 0], torch.arange(10, 25, dtype=torch.float32))
    assert cache.find(a, limit=a.shape[0] - 1)[1] == a.shape[0] - 1
    assert cache.find(np.array([99, 98]), limit=1) == (None, 0)


def test_a_sequence_that_extends_a_cached_one_replaces_it():
    cache = PrefixCache(10**6)
    first = np.arange(3, 23)
    cache.store(first, *rows(first))
    longer = np.concatenate([first, np.arange(40, 50)])
    cache.store(longer, *rows(longer))
    assert len(cache.entries) == 1 and cache.nbytes == longer.shape[0] * ROW_BYTES
    cache.store(first[:12], *rows(first[:12]))  # already covered: nothing added
    assert len(cache.entries) == 1


def test_a_thousand_calls_of_varied_prompts_never_exceed_the_cap():
    cap = 300 * ROW_BYTES
    cache = PrefixCache(cap)
    rng = np.random.default_rng(0)
    stems = [rng.integers(3, 500, size=200) for _ in range(6)]  # sessions that grow, part and start afresh
    for call in range(1000):
        stem = stems[call % 6]
        cut = int(rng.integers(1, 200))
        tokens = np.concatenate([stem[:cut], rng.integers(3, 500, size=int(rng.integers(1, 400)))])
        cache.find(tokens, tokens.shape[0] - 1)
        cache.store(tokens, *rows(tokens))
        assert cache.nbytes <= cap
        if tokens.shape[0] * ROW_BYTES <= cap:  # the latest sequence always fits whole
            assert cache.find(tokens, tokens.shape[0])[1] == tokens.shape[0]
    assert cache.nbytes > cap // 2  # it was used, not emptied


def test_the_least_recently_used_entry_goes_first_and_a_big_one_keeps_its_start():
    cache = PrefixCache(50 * ROW_BYTES)
    a, b, c = np.arange(3, 23), np.arange(100, 120), np.arange(200, 220)
    cache.store(a, *rows(a))
    cache.store(b, *rows(b))
    cache.find(a, 5)  # a is now more recent than b
    cache.store(c, *rows(c))
    kept = [entry.tokens[0] for entry in cache.entries]
    assert 100 not in kept and 3 in kept and 200 in kept
    huge = np.arange(300, 400)
    cache.store(huge, *rows(huge))
    assert len(cache.entries) == 1 and np.array_equal(cache.entries[0].tokens, huge[:50])
    assert cache.nbytes == 50 * ROW_BYTES


def test_a_zero_cap_holds_nothing_and_resizing_evicts():
    cache = PrefixCache(40 * ROW_BYTES)
    for start in (3, 100):
        tokens = np.arange(start, start + 20)
        cache.store(tokens, *rows(tokens))
    cache.resize(25 * ROW_BYTES)
    assert cache.nbytes == 20 * ROW_BYTES
    cache.resize(0)
    cache.store(np.arange(3, 10), *rows(np.arange(3, 10)))
    assert cache.entries == [] and cache.nbytes == 0


def test_the_weights_signature_follows_in_place_writes():
    model = make_tiny_llama(seed=7)
    before = weights_signature(model)
    assert weights_signature(model) == before
    with torch.no_grad():
        model.lm_head.weight.add_(0.0)
    assert weights_signature(model) != before
    cache = PrefixCache(10**6)
    cache.check(before)
    cache.store(np.arange(3, 9), *rows(np.arange(3, 9)))
    cache.check(weights_signature(model))
    assert cache.entries == []


def test_a_sequence_that_holds_all_but_a_short_tail_of_an_entry_replaces_it():
    cache = PrefixCache(10**7)
    prompt = np.arange(3, 403)
    completion = np.concatenate([prompt, np.arange(600, 648)])  # a request and its 48-token completion
    cache.store(completion, *rows(completion))
    typed_on = np.concatenate([prompt, np.arange(700, 900)])  # the user typed past it instead
    cache.store(typed_on, *rows(typed_on))
    assert [entry.tokens.shape[0] for entry in cache.entries] == [typed_on.shape[0]]
    edited = np.concatenate([prompt[:50], [9], prompt[51:]])  # an edit near the top starts a branch
    cache.store(edited, *rows(edited))
    assert len(cache.entries) == 2
    short = np.arange(1000, 1020)
    cache.store(short, *rows(short))
    other = np.concatenate([short[:10], np.arange(900, 910)])  # shares half: a quarter at most may be spared
    cache.store(other, *rows(other))
    assert len(cache.entries) == 4
