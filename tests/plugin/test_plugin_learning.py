"""The plugin learns across calls with one model: its outputs become drafts, its acceptance rates carry over."""

import gc
import weakref

import numpy as np
import pytest
import torch

import retrieval_draft
from retrieval_draft.cache_dir import CACHE_ENV
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.drafters.history import SEPARATOR
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.plugin.hf import learned_rates, output_history
from tests.conftest import make_tiny_llama, random_prompt

NEW_TOKENS = 40


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test's models start from the priors: no rates saved by other tests' same-shaped models."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))


def plugin(model, prompt, **kwargs) -> tuple[torch.Tensor, DecodeStats]:
    stats = DecodeStats()
    kwargs = {"do_sample": False, **kwargs}
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=NEW_TOKENS,
        custom_generate=retrieval_draft.generate,
        draft_stats=stats,
        **kwargs,
    )
    return out, stats


def hf_greedy(model, prompt) -> torch.Tensor:
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False)


def test_a_repeated_request_is_drafted_from_the_first_ones_output():
    model = make_tiny_llama(seed=11)
    prompt = random_prompt(5)
    first, first_stats = plugin(model, prompt)
    history = output_history(model)
    assert history.size == first.shape[1] + 1  # prompt, output and one separator
    second, second_stats = plugin(model, prompt)
    expected = hf_greedy(model, prompt)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    # the first call drafts from its own context and recycled logits; the second copies the first's output
    assert second_stats.mean_accepted > first_stats.mean_accepted + 1.0
    assert second_stats.mean_accepted > 3.0
    assert history.size == 2 * (first.shape[1] + 1)


def test_draft_learning_false_neither_reads_nor_grows_the_history():
    model = make_tiny_llama(seed=12)
    prompt = random_prompt(6)
    plugin(model, prompt)
    size = output_history(model).size
    out, off = plugin(model, prompt, draft_learning=False)
    assert torch.equal(out, hf_greedy(model, prompt))
    assert output_history(model).size == size
    _, on = plugin(model, prompt)
    assert on.mean_accepted > off.mean_accepted + 1.0


def test_explicit_drafters_leave_the_history_out():
    model = make_tiny_llama(seed=13)
    plugin(model, random_prompt(7), drafters=[PromptLookupDrafter()])
    assert output_history(model).size == 0  # the history exists only once asked for, empty


def test_the_history_goes_with_its_model():
    model = make_tiny_llama(seed=14)
    plugin(model, random_prompt(8))
    history = weakref.ref(output_history(model))
    assert history().size > 0
    del model
    gc.collect()
    assert history() is None


def graded(model, sampling: bool) -> float:
    """Draft tokens graded so far (decayed) by the shared prompt-lookup calibrator."""
    rates = learned_rates(model, sampling)
    return float(rates["prompt"].trials.sum()) if "prompt" in rates else 0.0


def test_each_call_starts_from_the_rates_earlier_calls_observed(monkeypatch):
    model = make_tiny_llama(seed=15)
    prompt = random_prompt(9, repeat=3)  # repeats: prompt lookup drafts, so there is something to grade
    plugin(model, prompt)
    assert graded(model, sampling=False) > 0
    calibrator = learned_rates(model, False)["prompt"]
    record = type(calibrator).record
    graders = []
    monkeypatch.setattr(type(calibrator), "record", lambda self, *args: (graders.append(self), record(self, *args))[1])
    out, _ = plugin(model, prompt, drafters=[PromptLookupDrafter()])  # explicit drafters learn too
    assert torch.equal(out, hf_greedy(model, prompt))
    assert learned_rates(model, False)["prompt"] is calibrator  # the same object...
    assert any(grader is calibrator for grader in graders)  # ...graded by the second call


def test_greedy_and_sampling_rates_are_kept_apart_and_opting_out_touches_neither():
    model = make_tiny_llama(seed=16)
    prompt = random_prompt(10, repeat=3)
    plugin(model, prompt, draft_learning=False)
    assert graded(model, sampling=False) == 0.0
    plugin(model, prompt, do_sample=True, temperature=0.8, draft_seed=0)
    assert graded(model, sampling=True) > 0
    assert graded(model, sampling=False) == 0.0


def test_a_new_process_starts_from_the_rates_an_earlier_one_saved(tmp_path):
    from retrieval_draft.sessions.memory import PluginMemory

    prompt = random_prompt(11, repeat=3)
    first = PluginMemory()  # one process
    plugin(make_tiny_llama(seed=17), prompt, draft_memory=first)
    later = PluginMemory()  # a later process: same model shape and name, nothing in memory
    rates = later.model(make_tiny_llama(seed=17)).rates[False]
    assert rates["prompt"].trials.sum() > 0
    assert PluginMemory(persist=False).model(make_tiny_llama(seed=17)).rates[False] == {}


def test_each_row_of_a_batch_adds_its_own_prompt_and_output_to_the_shared_history():
    model = make_tiny_llama(seed=15)
    prompts = [random_prompt(31, length=5)[0], random_prompt(32, length=9)[0]]
    ids = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, 9 - prompt.shape[0] :], mask[row, 9 - prompt.shape[0] :] = prompt, 1
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=[],
        custom_generate=retrieval_draft.generate, adaptive_tree=False,
    )
    buffer = output_history(model)._buffer
    ends = np.flatnonzero(buffer == SEPARATOR)  # each document is followed by one separator
    documents = [part[:-1].tolist() for part in np.split(buffer, ends + 1)[:-1]]
    expected = [prompts[row].tolist() + out[row, 9:].tolist() for row in range(2)]
    assert sorted(documents) == sorted(expected)  # one document per row, each its own prompt and output


def test_the_drafter_gate_carries_across_calls():
    from retrieval_draft.sessions.memory import PluginMemory

    memory = PluginMemory(persist=False)
    model = make_tiny_llama(seed=18)
    plugin(model, random_prompt(12, repeat=3), draft_memory=memory)
    gate = memory.model(model).gate
    queries = {name: record.queries for name, record in gate.records.items()}
    assert queries.get("prompt", 0) > 0  # the first call's steps were weighed
    out, _ = plugin(model, random_prompt(13, repeat=3), draft_memory=memory)
    assert torch.equal(out, hf_greedy(model, random_prompt(13, repeat=3)))
    assert memory.model(model).gate is gate and gate.records["prompt"].queries > queries["prompt"]
