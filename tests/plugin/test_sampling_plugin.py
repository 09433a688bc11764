"""``do_sample=True`` through the HF plugin: seeds, lengths, EOS, warpers, acceptance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import retrieval_draft
from retrieval_draft.draft import Draft, Drafter
from retrieval_draft.drafters.oracle import OracleDrafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from tests.conftest import TINY_VOCAB, RandomDrafter, make_tiny_llama, random_prompt


class GreedyDrafter(Drafter):
    """An oracle for sampling: drafts the model's own most likely continuation of the current context."""

    name = "greedy"

    def __init__(self, model) -> None:
        self.model = model

    def propose(self, context, max_len):
        ids = torch.from_numpy(context.copy())[None]
        out = self.model.generate(ids, max_new_tokens=max_len, do_sample=False, eos_token_id=[])
        return [Draft(out[0, ids.shape[1] :].numpy(), np.full(max_len, 0.9))]


@pytest.fixture(scope="module")
def peaked_llama():
    """conftest's tiny Llama with a sharp head: its favourite token usually carries most of the mass."""
    model = make_tiny_llama(seed=5)
    with torch.no_grad():
        model.lm_head.weight.mul_(100.0)
    return model


def sample(model, prompt, max_new_tokens, seed, drafters=None, **kwargs):
    """Our sampling; fixed-size trees so per-step statistics do not follow machine timings."""
    kwargs.setdefault("eos_token_id", [])
    kwargs.setdefault("adaptive_tree", False)
    kwargs.setdefault("tree_budget", 16)
    return model.generate(
        prompt,
        max_new_tokens=max_new_tokens,
        custom_generate=retrieval_draft.generate,
        do_sample=True,
        draft_seed=seed,
        drafters=drafters if drafters is not None else [PromptLookupDrafter()],
        **kwargs,
    )


def hf_greedy(model, prompt, max_new_tokens, **kwargs):
    kwargs.setdefault("eos_token_id", [])
    return model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)


def test_the_same_draft_seed_gives_the_same_sample(tiny_llama):
    prompt = random_prompt(400, length=12, repeat=3)
    first = sample(tiny_llama, prompt, 24, seed=123, drafters=[PromptLookupDrafter(), RandomDrafter(0)])
    torch.manual_seed(999)  # the global generator plays no part
    second = sample(tiny_llama, prompt, 24, seed=123, drafters=[PromptLookupDrafter(), RandomDrafter(0)])
    assert torch.equal(first, second)


def test_different_draft_seeds_give_different_samples(tiny_llama):
    # The tiny Llama's next-token distribution is close to uniform over 320 tokens:
    # two seeds agreeing on 16 tokens has probability around 320**-16.
    prompt = random_prompt(401, length=12, repeat=2)
    outputs = {tuple(sample(tiny_llama, prompt, 16, seed=seed)[0].tolist()) for seed in range(5)}
    assert len(outputs) == 5


def test_sampling_differs_from_greedy_decoding(tiny_llama):
    prompt = random_prompt(402, length=12, repeat=2)
    assert not torch.equal(sample(tiny_llama, prompt, 16, seed=0), hf_greedy(tiny_llama, prompt, 16))


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 20])
def test_a_sample_has_exactly_max_new_tokens_without_eos(peaked_llama, max_new_tokens):
    # Greedy drafts are long and mostly accepted, so the budget often ends inside a draft.
    prompt = random_prompt(403, length=10)
    stats = retrieval_draft.DecodeStats()
    out = sample(
        peaked_llama, prompt, max_new_tokens, seed=1, drafters=[GreedyDrafter(peaked_llama)], max_draft_len=8, draft_stats=stats
    )
    assert out.shape == (1, prompt.shape[1] + max_new_tokens)
    assert torch.equal(out[:, : prompt.shape[1]], prompt)
    assert stats.new_tokens == max_new_tokens
    if max_new_tokens == 1:
        assert stats.steps == 0  # the prefill gives the only token
    else:
        assert stats.steps >= 1


def test_eos_ends_a_sample_at_the_first_eos_the_same_seed_draws(tiny_llama):
    # EOS only decides where to stop, so with the same seed the draws up to it are the same.
    prompt = random_prompt(404, length=12, repeat=2)
    free_run = sample(tiny_llama, prompt, 20, seed=7)[0, prompt.shape[1] :].tolist()
    eos = free_run[6]
    stop = free_run.index(eos)  # its first occurrence, at most 6
    got = sample(tiny_llama, prompt, 20, seed=7, eos_token_id=eos)
    assert got[0, prompt.shape[1] :].tolist() == free_run[: stop + 1]


def test_eos_inside_an_accepted_draft_ends_the_sample_there(peaked_llama):
    prompt = random_prompt(405, length=10)
    stats = retrieval_draft.DecodeStats()
    drafters = [GreedyDrafter(peaked_llama)]
    free_run = sample(peaked_llama, prompt, 20, seed=3, drafters=drafters, temperature=0.5)[0, prompt.shape[1] :].tolist()
    eos = free_run[4]
    got = sample(peaked_llama, prompt, 20, seed=3, drafters=drafters, temperature=0.5, eos_token_id=eos, draft_stats=stats)
    assert got[0, prompt.shape[1] :].tolist() == free_run[: free_run.index(eos) + 1]
    assert stats.steps == 1  # one tree step ran past the EOS; nothing after it was emitted


def test_top_k_1_sampling_equals_greedy_decoding(tiny_llama):
    prompt = random_prompt(406, length=12, repeat=3)
    stats = retrieval_draft.DecodeStats()
    got = sample(tiny_llama, prompt, 30, seed=0, top_k=1, draft_stats=stats)
    assert torch.equal(got, hf_greedy(tiny_llama, prompt, 30))
    assert stats.mean_accepted > 1.0  # prompt lookup drafts were verified by sampling, not skipped


def test_tiny_top_p_sampling_equals_greedy_decoding(tiny_llama):
    prompt = random_prompt(407, length=12, repeat=3)
    assert torch.equal(sample(tiny_llama, prompt, 30, seed=0, top_p=1e-6), hf_greedy(tiny_llama, prompt, 30))


def test_repetition_penalty_uses_each_tree_nodes_own_prefix(tiny_llama):
    # top_k=1 makes sampling deterministic; the penalty then decides which token is
    # the top one, and it must see every node's path, as plain decoding would.
    prompt = random_prompt(408, length=12, repeat=2)
    expected = hf_greedy(tiny_llama, prompt, 30, repetition_penalty=5.0)
    assert not torch.equal(expected, hf_greedy(tiny_llama, prompt, 30))  # the penalty matters here
    stats = retrieval_draft.DecodeStats()
    drafters = [OracleDrafter(expected[0].numpy())]
    got = sample(tiny_llama, prompt, 30, seed=0, drafters=drafters, top_k=1, repetition_penalty=5.0, draft_stats=stats)
    assert torch.equal(got, expected)
    assert stats.mean_accepted > 6.0  # deep tree nodes were verified under the penalty


def test_all_sampling_warpers_together_are_accepted_and_reproducible(tiny_llama):
    prompt = random_prompt(409, length=12, repeat=2)
    kwargs = dict(temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.3)
    first = sample(tiny_llama, prompt, 20, seed=11, **kwargs)
    assert first.shape == (1, prompt.shape[1] + 20)
    assert int(first.min()) >= 0 and int(first.max()) < TINY_VOCAB
    assert torch.equal(first, sample(tiny_llama, prompt, 20, seed=11, **kwargs))


def test_near_zero_temperature_sampling_equals_greedy_decoding(peaked_llama):
    prompt = random_prompt(411, length=10)
    expected = hf_greedy(peaked_llama, prompt, 24)
    assert any(not torch.equal(sample(peaked_llama, prompt, 24, seed=seed), expected) for seed in (4, 5, 6))  # T=1 strays
    got = sample(peaked_llama, prompt, 24, seed=4, temperature=1e-3, drafters=[GreedyDrafter(peaked_llama)])
    assert torch.equal(got, expected)


def test_an_oracle_drafter_gets_many_sampled_tokens_accepted_per_step(peaked_llama):
    prompt = random_prompt(410, length=10)
    oracle, random = retrieval_draft.DecodeStats(), retrieval_draft.DecodeStats()
    sample(peaked_llama, prompt, 40, seed=2, drafters=[GreedyDrafter(peaked_llama)], temperature=0.5, draft_stats=oracle)
    sample(peaked_llama, prompt, 40, seed=2, drafters=[RandomDrafter(1)], temperature=0.5, draft_stats=random)
    print(f"mean accepted: oracle {oracle.mean_accepted:.2f}, random {random.mean_accepted:.2f}")
    assert oracle.mean_accepted > 4.0
    assert random.mean_accepted < 1.3


def test_global_torch_seed_makes_unseeded_sampling_reproducible(tiny_llama):
    from tests.conftest import random_prompt

    prompt = random_prompt(999)
    runs = []
    for _ in range(2):
        torch.manual_seed(1234)
        runs.append(
            tiny_llama.generate(prompt, max_new_tokens=12, do_sample=True, custom_generate=retrieval_draft.generate)
        )
    assert torch.equal(runs[0], runs[1])


def test_a_seed_fixes_the_output_whatever_the_tree_looks_like(tiny_llama):
    prompt = random_prompt(321, repeat=3)
    reference = sample(tiny_llama, prompt, 24, seed=7, drafters=[], tree_budget=0)
    for drafters, kwargs in (
        ([PromptLookupDrafter()], {"adaptive_tree": False, "tree_budget": 4}),
        ([PromptLookupDrafter(), RandomDrafter(3)], {"adaptive_tree": False, "tree_budget": 32}),
        ([PromptLookupDrafter()], {"adaptive_tree": True}),
    ):
        assert torch.equal(sample(tiny_llama, prompt, 24, seed=7, drafters=drafters, **kwargs), reference)
