"""The output history finds its matches through an index of where each token occurs, and drafts
exactly what a scan of the whole buffer would."""

import numpy as np
import pytest

from retrieval_draft.draft import Proposals
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.drafters.tail_match import continuations, tail_matches
from retrieval_draft.drafters.token_positions import TokenPositions


@pytest.mark.parametrize("seed", range(6))
def test_positions_equal_a_scan_through_appends_and_evictions(seed):
    rng = np.random.default_rng(seed)
    buffer, index = np.empty(0, np.int64), TokenPositions()
    for _ in range(30):
        if buffer.size and rng.random() < 0.25:
            start = int(rng.integers(0, buffer.size + 1))
            buffer = buffer[start:]
            index.drop_before(start)
        else:
            tokens = rng.integers(-1, 6, int(rng.integers(0, 40)))  # -1: separators, never indexed
            index.extend(tokens, buffer.size)
            buffer = np.concatenate([buffer, tokens])
        assert len(index) == np.count_nonzero(buffer >= 0)
        for token in range(6):
            below = int(rng.integers(0, buffer.size + 2))
            np.testing.assert_array_equal(index.positions(token, below), np.flatnonzero(buffer[:below] == token))


def test_an_index_of_a_whole_buffer_equals_one_grown_piece_by_piece():
    buffer = np.random.default_rng(1).integers(-1, 9, 500)
    grown = TokenPositions()
    for start in range(0, 500, 37):
        grown.extend(buffer[start : start + 37], start)
    whole = TokenPositions.of(buffer)
    for token in range(9):
        np.testing.assert_array_equal(whole.positions(token, 500), grown.positions(token, 500))


def test_positions_beyond_what_the_keys_hold_are_refused():
    with pytest.raises(ValueError, match="2\\*\\*32"):
        TokenPositions().extend(np.array([1, 2]), 2**32 - 1)


def scanned_drafts(history: HistoryDrafter, context: np.ndarray, max_len: int) -> list[tuple[list, list]]:
    """What the history drafts when its whole buffer is scanned for the context's last token."""
    out = Proposals([history.name])
    haystack = history.tokens
    if haystack.shape[0] >= 2:
        ends, lengths = tail_matches(haystack, context, history.max_ngram)
        keep = lengths >= history.min_ngram
        if keep.any():
            continuations(haystack, ends[keep], lengths[keep], max_len, history.max_branches, out.writer(history.name))
    return [(d.tokens.tolist(), d.probs.tolist()) for d in out.drafts()]


@pytest.mark.parametrize("seed", range(4))
def test_the_history_drafts_what_a_scan_of_its_buffer_drafts_as_it_fills_and_evicts(seed):
    rng = np.random.default_rng(seed)
    history = HistoryDrafter(max_tokens=300, min_ngram=int(rng.integers(1, 3)))
    evicted = False
    for step in range(40):
        before = history.size
        length = 350 if step == 20 else int(rng.integers(5, 60))  # one document longer than the buffer
        history.add(rng.integers(0, 8, length))
        evicted |= history.size < before
        for _ in range(3):
            context = rng.integers(0, 8, int(rng.integers(1, 12)))
            got = [(d.tokens.tolist(), d.probs.tolist()) for d in history.propose(context, max_len=6)]
            assert got == scanned_drafts(history, context, 6)
    assert evicted  # the eviction path was walked


def test_the_tokens_a_history_holds_are_shown_read_only():
    history = HistoryDrafter()
    history.add(np.array([4, 5, 6]))
    assert history.tokens.tolist() == [4, 5, 6, -1]
    with pytest.raises(ValueError):
        history.tokens[0] = 9  # the index would no longer match the buffer


def test_a_loaded_history_is_indexed(tmp_path):
    history = HistoryDrafter()
    history.add(np.array([4, 5, 6, 7, 8]))
    history.save(tmp_path / "history.npz")
    loaded = HistoryDrafter.load(tmp_path / "history.npz")
    assert [d.tokens.tolist() for d in loaded.propose(np.array([1, 5, 6]), max_len=2)] == [[7, 8]]
