"""Threads sharing one model: every plugin call finishes with plain generate's output."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

import retrieval_draft
from tests.conftest import make_tiny_llama, random_prompt

NEW_TOKENS = 24


def _plain(model, prompt):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False)


def _ours(model, prompt):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False,
                          custom_generate=retrieval_draft.generate)


def test_threads_sharing_one_model_all_get_plain_generates_output():
    model = make_tiny_llama(seed=51)
    prompts = [random_prompt(60 + i, repeat=2) for i in range(8)]
    expected = [_plain(model, p) for p in prompts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda p: _ours(model, p), prompts))
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_the_model_is_left_as_it_was_after_concurrent_calls():
    model = make_tiny_llama(seed=52)
    prompts = [random_prompt(70 + i, repeat=2) for i in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda p: _ours(model, p), prompts))
    assert model.config._attn_implementation == "sdpa"
    assert all("forward" not in vars(m) for m in model.modules() if isinstance(m, torch.nn.Linear))
