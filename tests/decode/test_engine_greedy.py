"""The engine on a tiny random Llama: greedy output equals HF greedy generate."""

import numpy as np
import pytest
import torch

import retrieval_draft
from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.draft import Draft, Drafter
from retrieval_draft.drafters.oracle import OracleDrafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.model.tree_model import TreeModel
from retrieval_draft.planning.planner import TreePlanner
from tests.conftest import TINY_VOCAB, RandomDrafter, make_tiny_llama, random_prompt


class MixedDrafter(Drafter):
    """The oracle's chain, corrupted after a random point, plus a random sibling branch."""

    name = "mixed"

    def __init__(self, reference: np.ndarray, seed: int) -> None:
        self.oracle = OracleDrafter(reference)
        self.rng = np.random.default_rng(seed)

    def propose(self, context, max_len):
        drafts = self.oracle.propose(context, max_len)
        if not drafts:
            return []
        tokens = drafts[0].tokens.copy()
        cut = int(self.rng.integers(0, len(tokens)))
        tokens[cut:] = self.rng.integers(3, TINY_VOCAB, size=len(tokens) - cut)
        noise = self.rng.integers(3, TINY_VOCAB, size=len(tokens))
        return [Draft(tokens, np.full(len(tokens), 0.6)), Draft(noise, np.full(len(tokens), 0.3))]


def hf_greedy(model, prompt, max_new_tokens, eos=None):
    kwargs = {} if eos is None else {"eos_token_id": eos}
    return model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)


def ours(model, prompt, max_new_tokens, drafters, **kwargs):
    """Our plugin on fixed-size trees, so per-step statistics do not follow machine timings
    (the plugin's default, cost-aware sizing is covered by the random-prompt test)."""
    kwargs.setdefault("adaptive_tree", False)
    kwargs.setdefault("tree_budget", 16)
    return model.generate(
        prompt, max_new_tokens=max_new_tokens, custom_generate=retrieval_draft.generate, drafters=drafters, **kwargs
    )


@pytest.mark.parametrize("seed", range(24))
def test_plugin_output_equals_hf_greedy_on_random_prompts(tiny_llama, seed):
    prompt = random_prompt(seed, length=12, repeat=2 + seed % 3)
    expected = hf_greedy(tiny_llama, prompt, 32)
    got = tiny_llama.generate(prompt, max_new_tokens=32, custom_generate=retrieval_draft.generate)
    assert torch.equal(got, expected)


def test_oracle_drafts_are_all_accepted(tiny_llama):
    prompt = random_prompt(100)
    expected = hf_greedy(tiny_llama, prompt, 40, eos=[])
    stats = retrieval_draft.DecodeStats()
    got = ours(tiny_llama, prompt, 40, [OracleDrafter(expected[0].numpy())], max_draft_len=8, draft_stats=stats, eos_token_id=[])
    assert torch.equal(got, expected)
    # Every step accepts the full 8-token draft plus the bonus, except where the budget ends.
    assert stats.mean_accepted > 7.0
    assert stats.steps <= 40 // 9 + 1


def test_random_drafts_are_rejected_and_output_is_unchanged(tiny_llama):
    prompt = random_prompt(101)
    expected = hf_greedy(tiny_llama, prompt, 30)
    stats = retrieval_draft.DecodeStats()
    got = ours(tiny_llama, prompt, 30, [RandomDrafter(0)], draft_stats=stats, adaptive_tree=False, tree_budget=12)
    assert torch.equal(got, expected)
    assert stats.mean_accepted < 1.2
    assert stats.tree_nodes > stats.steps * 5  # trees really were drafted and scored


@pytest.mark.parametrize("seed", range(6))
def test_mixed_trees_keep_output_identical(tiny_llama, seed):
    prompt = random_prompt(200 + seed)
    expected = hf_greedy(tiny_llama, prompt, 40, eos=[])
    drafter = MixedDrafter(expected[0].numpy(), seed)
    stats = retrieval_draft.DecodeStats()
    got = ours(tiny_llama, prompt, 40, [drafter], draft_stats=stats, eos_token_id=[])
    assert torch.equal(got, expected)
    assert 1.0 < stats.mean_accepted


def test_eos_inside_an_accepted_draft_ends_output_there(tiny_llama):
    prompt = random_prompt(300)
    free_run = hf_greedy(tiny_llama, prompt, 20, eos=[])
    eos = int(free_run[0, prompt.shape[1] + 5])  # the 6th new token acts as EOS
    expected = hf_greedy(tiny_llama, prompt, 20, eos=eos)
    assert expected.shape[1] <= prompt.shape[1] + 6
    stats = retrieval_draft.DecodeStats()
    got = ours(tiny_llama, prompt, 20, [OracleDrafter(free_run[0].numpy())], eos_token_id=eos, draft_stats=stats)
    assert torch.equal(got, expected)
    assert stats.steps == 1  # the draft ran past the EOS, and nothing after it was emitted


def test_max_new_tokens_ending_inside_a_draft_truncates_it(tiny_llama):
    prompt = random_prompt(301)
    long_run = hf_greedy(tiny_llama, prompt, 30, eos=[])
    expected = hf_greedy(tiny_llama, prompt, 5, eos=[])
    got = ours(tiny_llama, prompt, 5, [OracleDrafter(long_run[0].numpy())], max_draft_len=8, eos_token_id=[])
    assert torch.equal(got, expected)


def test_single_new_token_needs_no_draft_step(tiny_llama):
    prompt = random_prompt(302)
    stats = retrieval_draft.DecodeStats()
    got = ours(tiny_llama, prompt, 1, [PromptLookupDrafter()], draft_stats=stats)
    assert torch.equal(got, hf_greedy(tiny_llama, prompt, 1))
    assert stats.steps == 0


def test_eager_attention_gives_the_same_output():
    model = make_tiny_llama(seed=3, attn="eager")
    prompt = random_prompt(303, repeat=3)
    assert torch.equal(ours(model, prompt, 24, [PromptLookupDrafter()]), hf_greedy(model, prompt, 24))


def test_engine_api_returns_new_tokens_and_stats(tiny_llama):
    prompt = random_prompt(304, repeat=2)
    expected = hf_greedy(tiny_llama, prompt, 16, eos=[])
    (tokens,), stats = speculative_decode(
        TreeModel(tiny_llama), prompt, [[PromptLookupDrafter()]], DecodeOptions(max_new_tokens=16)
    )
    assert tokens.tolist() == expected[0, prompt.shape[1] :].tolist()
    assert stats.new_tokens == 16
    assert stats.steps >= 1 and stats.verify_s > 0


class RootRecorder(Drafter):
    """Proposes nothing; notes the pending token of each step it is asked in and the root of each
    verified tree it is handed."""

    name = "recorder"
    observes_trees = True

    def __init__(self) -> None:
        self.asked_at: list[int] = []
        self.recorded: list[int] = []

    def propose(self, context, max_len):
        self.asked_at.append(int(context[-1]))
        return []

    def tree_request(self, logits, nodes):
        return torch.zeros((sum(len(chosen) for chosen in nodes), 0), dtype=torch.int32)

    def tree_receive(self, tokens, columns):
        self.recorded.append(int(tokens[0]))


class EveryOtherStep(TreePlanner):
    """Asks its drafters on odd steps only, as a drafter gate that skips them would."""

    def __init__(self) -> None:
        super().__init__(tree_budget=4)
        self.calls = 0

    def should_ask(self, name):
        self.calls += 1
        return self.calls % 2 == 1


def test_an_observer_records_only_the_trees_of_steps_it_was_asked_in(tiny_llama):
    recorder = RootRecorder()
    planner = EveryOtherStep()
    (tokens,), stats = speculative_decode(TreeModel(tiny_llama), random_prompt(305), [[recorder]],
                                          DecodeOptions(max_new_tokens=12), planner=planner)
    assert stats.forwards == 11 and planner.calls == 11  # nothing drafted: one token a step after the prefill's
    assert len(recorder.asked_at) == 5  # steps 1, 3, ..., 9 (step 11, with one token left, drafts nothing)
    assert recorder.recorded == recorder.asked_at
