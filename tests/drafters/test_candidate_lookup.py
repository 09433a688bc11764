"""Candidate lookup: retrieval from the context extended by each likely next token (LogitSpec's direction)."""

from __future__ import annotations

import numpy as np
import torch

from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.drafters.candidate_lookup import CandidateLookupDrafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.drafters.recycling import RecyclingDrafter
from retrieval_draft.model.tree_model import TreeModel
from tests.conftest import TINY_VOCAB, random_prompt


def _table(rows: dict[int, list[tuple[int, float]]], vocab: int = 50) -> RecyclingDrafter:
    table = RecyclingDrafter(vocab, k=3)
    for token, successors in rows.items():
        for i, (successor, prob) in enumerate(successors):
            table.successors[token, i], table.probs[token, i] = successor, prob
    return table


def test_candidates_are_the_pending_tokens_successors_then_its_predecessors_runners_up_each_once():
    table = _table({7: [(8, 0.6), (9, 0.2)], 5: [(7, 0.7), (8, 0.1), (11, 0.05)]})
    drafter = CandidateLookupDrafter(table, [PromptLookupDrafter()], max_candidates=3)
    ids, probs = drafter.candidates(np.array([1, 5, 7]))
    assert ids.tolist() == [8, 9, 7]  # 8 once (from 7's row), then 5's row: 7 (the pending token itself may repeat)
    np.testing.assert_allclose(probs, [0.6, 0.2, 0.7])


def test_each_draft_is_a_candidate_followed_by_what_the_context_held_after_it():
    context = np.array([3, 4, 8, 20, 21, 22, 30, 31, 4])  # after 4 came 8 then 20, 21, 22
    table = _table({4: [(8, 0.5)]})
    drafts = CandidateLookupDrafter(table, [PromptLookupDrafter()]).propose(context, max_len=4)
    assert drafts and all(d.tokens[0] == 8 for d in drafts)
    assert drafts[0].tokens.tolist() == [8, 20, 21, 22] and drafts[0].probs[0] == 0.5


def test_an_empty_table_drafts_nothing():
    drafter = CandidateLookupDrafter(RecyclingDrafter(50, k=3), [PromptLookupDrafter()])
    assert drafter.propose(np.array([1, 2, 3, 1, 2]), max_len=4) == []


def test_decoding_with_candidate_drafts_equals_greedy(tiny_llama):
    prompt = random_prompt(11, length=16, repeat=3)
    plain = tiny_llama.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)
    table = RecyclingDrafter(TINY_VOCAB, k=4)
    drafters = [PromptLookupDrafter(), table, CandidateLookupDrafter(table, [PromptLookupDrafter()])]
    outputs, _ = speculative_decode(TreeModel(tiny_llama), prompt, [drafters], DecodeOptions(max_new_tokens=24))
    assert np.array_equal(outputs[0], plain[0, prompt.shape[1]:].numpy())
