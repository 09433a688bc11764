"""Prompt lookup proposes what followed earlier occurrences of the context's tail."""

import numpy as np

from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter


def ids(*tokens):
    return np.array(tokens, dtype=np.int64)


def test_proposes_the_continuation_of_the_longest_match():
    context = ids(1, 2, 3, 4, 5, 9, 9, 1, 2, 3)
    drafts = PromptLookupDrafter().propose(context, max_len=3)
    assert drafts[0].tokens.tolist() == [4, 5, 9]


def test_longer_matches_rank_before_more_recent_shorter_ones():
    # "7 3" occurred after "2 3" long ago; "8 3" recently. The tail "2 3" matches the first.
    context = ids(2, 3, 7, 7, 7, 8, 3, 6, 6, 2, 3)
    drafts = PromptLookupDrafter().propose(context, max_len=2)
    assert drafts[0].tokens.tolist() == [7, 7]
    assert [6, 6] in [d.tokens.tolist() for d in drafts]
    assert drafts[0].probs[0] > drafts[1].probs[0]


def test_several_positions_give_several_branches():
    context = ids(5, 1, 5, 2, 5, 3, 5)
    drafts = PromptLookupDrafter(max_branches=4).propose(context, max_len=1)
    assert sorted(d.tokens[0] for d in drafts) == [1, 2, 3]


def test_no_match_means_no_drafts():
    assert PromptLookupDrafter().propose(ids(1, 2, 3, 4), max_len=4) == []
    assert PromptLookupDrafter().propose(ids(1), max_len=4) == []


def test_drafts_never_exceed_max_len_or_run_past_the_context():
    context = ids(4, 4, 4, 4, 4, 4)
    for draft in PromptLookupDrafter().propose(context, max_len=3):
        assert 1 <= len(draft) <= 3


def test_min_ngram_filters_short_matches():
    context = ids(1, 9, 5, 6, 7, 5)
    assert PromptLookupDrafter(min_ngram=2).propose(context, max_len=2) == []
    assert PromptLookupDrafter(min_ngram=1).propose(context, max_len=2)[0].tokens.tolist() == [6, 7]


def test_later_copied_tokens_get_the_rate_of_the_longer_match_behind_them():
    from retrieval_draft.drafters.tail_match import FIRST_TOKEN_PROB, MATCH_LENGTH_BANDS, NEXT_TOKEN_PROB

    # The tail "1 2" matches once (length 2); copying "3 4 5 6 7 8" extends it to 3, 4, ... 7.
    context = ids(1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2)
    draft = PromptLookupDrafter().propose(context, max_len=6)[0]
    assert draft.tokens.tolist() == [3, 4, 5, 6, 7, 8]
    band = np.searchsorted(MATCH_LENGTH_BANDS, [2, 3, 4, 5, 6, 7], side="right") - 1
    np.testing.assert_allclose(draft.probs, [FIRST_TOKEN_PROB[band[0]], *NEXT_TOKEN_PROB[band[1:]]])
    assert np.all(np.diff(draft.probs[1:]) >= 0)


def test_a_long_match_is_trusted_more_than_a_short_one():
    text = np.arange(10, 40, dtype=np.int64)
    long_tail = np.concatenate([text, [99], text[:25]])  # tail matches 25 tokens
    short_tail = np.concatenate([text, [99], text[24:25]])  # tail matches 1 token
    long_draft = PromptLookupDrafter().propose(long_tail, max_len=4)[0]
    short_draft = PromptLookupDrafter().propose(short_tail, max_len=4)[0]
    assert long_draft.tokens.tolist() == short_draft.tokens.tolist() == [35, 36, 37, 38]
    assert np.all(long_draft.probs > short_draft.probs)
    assert long_draft.probs[0] > 0.9
