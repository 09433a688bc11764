"""Batches: every row of our batched greedy output equals HF's batched greedy ``generate``.

The reference is HF's output on the SAME left-padded batch. HF's batched
rows can differ from what HF generates for each prompt alone: padding
changes the shapes of the matmuls and attention reductions, so logits move
by float rounding and a near-tie can flip an argmax. That is HF's own
behaviour; ``test_hf_batched_rows_versus_single_rows`` measures how often it
happens here and our rows are always compared with HF's batched rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Qwen2Config, Qwen2ForCausalLM, StoppingCriteria, StoppingCriteriaList
from transformers.generation import GenerateDecoderOnlyOutput

import retrieval_draft
from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.tree import DraftTree
from retrieval_draft.drafters.oracle import OracleDrafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.model.tree_model import TreeModel
from tests.conftest import TINY_VOCAB, RandomDrafter, make_tiny_llama, random_prompt


def tiny_qwen2() -> Qwen2ForCausalLM:
    """Qwen2: biased q/k/v projections, 4 query heads over 2 KV heads."""
    torch.manual_seed(1)
    config = Qwen2Config(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa",
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    return Qwen2ForCausalLM(config).eval()


def tiny_gemma3() -> Gemma3ForCausalLM:
    """Gemma 3: sliding-window layers (window 8) mixed with full attention."""
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        attn_implementation="sdpa", eos_token_id=2, pad_token_id=0, bos_token_id=1,
    )
    return Gemma3ForCausalLM(config).eval()


MAKERS = {
    "llama-sdpa": lambda: make_tiny_llama(),
    "llama-eager": lambda: make_tiny_llama(attn="eager"),
    "qwen2": tiny_qwen2,
    "gemma3-sliding": tiny_gemma3,
}


@pytest.fixture(scope="module", params=sorted(MAKERS))
def model(request):
    built = MAKERS[request.param]()
    built.generation_config.eos_token_id = 2
    built.generation_config.pad_token_id = 0
    return built


def left_padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids and mask of 1-D prompts, left-padded with id 0 as a left-padding tokenizer does."""
    length = max(p.shape[0] for p in prompts)
    ids = torch.zeros(len(prompts), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, length - prompt.shape[0] :] = prompt
        mask[row, length - prompt.shape[0] :] = 1
    return ids, mask


def mixed_batch(seed: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths (8 to 48 tokens), each a repeated random block (drafts get accepted)."""
    rng = np.random.default_rng(seed)
    prompts = [
        random_prompt(seed * 100 + row, length=int(rng.integers(4, 17)), repeat=int(rng.integers(2, 4)))[0]
        for row in range(rows)
    ]
    return left_padded(prompts)


def ours(model, ids, mask, max_new_tokens, **kwargs):
    kwargs.setdefault("adaptive_tree", False)
    kwargs.setdefault("tree_budget", 12)
    return model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
        custom_generate=retrieval_draft.generate, **kwargs,
    )


def hf(model, ids, mask, max_new_tokens, **kwargs):
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)


@pytest.mark.parametrize("seed,rows", [(0, 2), (1, 3), (2, 5), (3, 8)])
def test_every_row_equals_hf_batched_greedy_on_mixed_prompt_lengths(model, seed, rows):
    ids, mask = mixed_batch(seed, rows)
    expected = hf(model, ids, mask, 24)
    stats = retrieval_draft.DecodeStats()
    got = ours(model, ids, mask, 24, draft_stats=stats)
    assert got.shape == expected.shape
    assert torch.equal(got, expected)
    assert stats.tree_nodes > stats.steps  # trees of several nodes were verified, not single tokens


def test_rows_ending_at_different_steps_are_padded_as_hf_pads_them(model):
    ids, mask = mixed_batch(7, 4)
    free = hf(model, ids, mask, 24, eos_token_id=[])
    # EOS := the token row 0 emits 6th: rows stop at different steps (or never), as HF's output shows.
    eos = int(free[0, ids.shape[1] + 5])
    expected = hf(model, ids, mask, 24, eos_token_id=eos)
    got = ours(model, ids, mask, 24, eos_token_id=eos)
    ends = [(row[ids.shape[1] :] == eos).nonzero()[:1].flatten().tolist() for row in expected]
    assert ends[0] and len({tuple(end) for end in ends}) > 1  # row 0 stops early; not every row stops with it
    assert torch.equal(got, expected)


def test_rows_accepting_different_amounts_keep_their_own_cache(model):
    """Row 0 drafts the exact answer (everything accepted), row 1 random tokens (nothing), row 2
    prompt lookup: the rows' kept lengths drift apart every step (the gaps the mask hides)."""
    ids, mask = mixed_batch(11, 3)
    expected = hf(model, ids, mask, 30, eos_token_id=[])
    reference = expected[0][torch.cat([mask[0].bool(), torch.ones(30, dtype=torch.bool)])].numpy()
    drafters = [[OracleDrafter(reference)], [RandomDrafter(3)], [PromptLookupDrafter()]]
    stats = retrieval_draft.DecodeStats()
    got = ours(model, ids, mask, 30, eos_token_id=[], drafters=drafters, max_draft_len=6, draft_stats=stats)
    assert torch.equal(got, expected)
    assert stats.mean_accepted > 1.5


def test_hf_batched_rows_versus_single_rows(model):
    """Our rows equal HF's batched rows; HF's batched rows are compared with HF's single-row
    outputs only to report float-rounding flips (not asserted: they are HF's behaviour)."""
    ids, mask = mixed_batch(5, 4)
    batched = hf(model, ids, mask, 24, eos_token_id=[])
    flips = 0
    for row in range(ids.shape[0]):
        alone = hf(model, ids[row : row + 1, mask[row].bool()], None, 24, eos_token_id=[])
        flips += int(not torch.equal(alone[0, -24:], batched[row, -24:]))
    got = ours(model, ids, mask, 24, eos_token_id=[])
    print(f"HF batched rows differing from HF single rows: {flips} of {ids.shape[0]}")
    assert torch.equal(got, batched), f"(HF batched rows differing from HF single rows: {flips})"


def test_one_padded_row_and_the_default_cost_aware_planner(model):
    ids, mask = left_padded([random_prompt(3, length=10, repeat=2)[0], random_prompt(4, length=5, repeat=3)[0]])
    expected = hf(model, ids[1:], mask[1:], 20)
    got = model.generate(input_ids=ids[1:], attention_mask=mask[1:], max_new_tokens=20,
                         custom_generate=retrieval_draft.generate)
    assert torch.equal(got, expected)
    expected = hf(model, ids, mask, 20)
    got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, custom_generate=retrieval_draft.generate)
    assert torch.equal(got, expected)


def test_return_dict_in_generate_holds_the_batch(tiny_llama):
    ids, mask = mixed_batch(2, 3)
    expected = hf(tiny_llama, ids, mask, 12)
    out = ours(tiny_llama, ids, mask, 12, return_dict_in_generate=True)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, expected)


def test_batch_scores_equal_separate_single_row_scores(tiny_llama):
    """The batched tree forward (per-row positions, padding and gaps masked) gives each row the
    logits a single-row tree forward gives it, before and after rows keep different paths."""
    prompts = [random_prompt(20, length=14)[0], random_prompt(21, length=6)[0]]
    ids, mask = left_padded(prompts)
    batch = TreeModel(tiny_llama)
    singles = [TreeModel(tiny_llama) for _ in prompts]
    first = batch.prefill(ids, mask)
    for row, single in enumerate(singles):
        assert torch.allclose(first[row], single.prefill(prompts[row][None])[0], atol=1e-4)
    wide = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, 0, 0, 1]), np.array([0, 1, 1, 2]), np.ones(4))
    narrow = DraftTree(np.array([9, 10]), np.array([-1, 0]), np.array([0, 1]), np.ones(2))
    for kept in ([np.array([0, 2]), np.array([0])], [np.array([0, 1, 3]), np.array([0, 1])]):
        trees = [wide, narrow]
        scored = batch.score_trees(trees)
        for row, (single, tree) in enumerate(zip(singles, trees)):
            alone = single.score_trees([tree])[0]
            assert torch.allclose(scored[row, : tree.size], alone, atol=1e-4)
            single.keep([kept[row]])
        batch.keep(kept)


def test_finished_rows_leave_the_forward(tiny_llama):
    ids, mask = mixed_batch(7, 4)
    free = hf(tiny_llama, ids, mask, 24, eos_token_id=[])
    eos = int(free[0, ids.shape[1] + 2])
    options = DecodeOptions(max_new_tokens=24, eos_ids=frozenset([eos]), max_draft_len=4)
    planner = TreePlanner(tree_budget=0)
    outputs, stats = speculative_decode(TreeModel(tiny_llama), ids, [[] for _ in range(4)], options, mask, planner)
    assert outputs[0].shape[0] <= 3 and outputs[0][-1] == eos
    assert stats.steps < stats.forwards * 4  # later forwards ran without the finished row
    assert stats.tree_slots == stats.steps  # plain batched decoding: one token per row


def test_bad_batches_are_refused_before_model_work(tiny_llama):
    ids, mask = mixed_batch(1, 2)
    right = torch.flip(mask, dims=[1])
    with pytest.raises(InvalidInputError, match="right padding"):
        ours(tiny_llama, torch.flip(ids, dims=[1]), right, 4)
    with pytest.raises(InvalidInputError, match="one list per row"):
        ours(tiny_llama, ids, mask, 4, drafters=[[PromptLookupDrafter()]])
    with pytest.raises(InvalidInputError, match="one per row"):
        ours(tiny_llama, ids, mask, 4, draft_streamer=object())


class StopAtToken(StoppingCriteria):
    """Stops a row right after it emits ``token`` (a per-row criterion, as stop strings are)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_a_stopping_criterion_stops_each_row_where_hf_stops_it(tiny_llama):
    ids, mask = mixed_batch(9, 3)
    free = hf(tiny_llama, ids, mask, 20, eos_token_id=[])
    stop = int(free[1, ids.shape[1] + 3])
    criteria = StoppingCriteriaList([StopAtToken(stop)])
    expected = hf(tiny_llama, ids, mask, 20, eos_token_id=[], stopping_criteria=criteria)
    got = ours(tiny_llama, ids, mask, 20, eos_token_id=[], stopping_criteria=criteria)
    assert (expected[1, ids.shape[1] + 4 :] == 0).all()  # row 1 stopped early and was padded
    assert torch.equal(got, expected)


def test_a_batch_of_32_rows_equals_hf_batched_greedy(tiny_llama):
    ids, mask = mixed_batch(12, 32)
    expected = hf(tiny_llama, ids, mask, 16)
    got = ours(tiny_llama, ids, mask, 16)
    assert torch.equal(got, expected)
