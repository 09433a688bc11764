"""tail_match.continuations: the compiled pass writes the drafts its rule describes."""

from __future__ import annotations

import numpy as np

from retrieval_draft.draft import Proposals
from retrieval_draft.drafters.tail_match import (
    FIRST_TOKEN_PROB, MATCH_LENGTH_BANDS, NEXT_TOKEN_PROB, continuations,
)


def _reference(haystack, ends, lengths, max_len, max_branches):
    """The rule read plainly: longest match first, then most recent; each continuation up to a
    separator, distinct ones only; probabilities by the match length behind each token, the first
    one's shared among the matches at least as long by how many of them continue with it."""
    drafts, seen = [], set()
    next_tokens = haystack[ends + 1]
    for end, length in sorted(zip(ends.tolist(), lengths.tolist()), key=lambda pair: (-pair[1], -pair[0])):
        tokens = []
        for token in haystack[end + 1 : end + 1 + max_len].tolist():
            if token < 0:
                break
            tokens.append(token)
        if not tokens or tuple(tokens) in seen:
            continue
        seen.add(tuple(tokens))
        level = lengths >= length
        share = np.count_nonzero(next_tokens[level] == tokens[0]) / np.count_nonzero(level)
        bands = [int(np.searchsorted(MATCH_LENGTH_BANDS, length + i, side="right")) - 1 for i in range(len(tokens))]
        probs = [float(NEXT_TOKEN_PROB[band]) for band in bands]
        probs[0] = max(float(FIRST_TOKEN_PROB[bands[0]]) * share, 1e-3)
        drafts.append((tokens, probs))
        if len(drafts) == max_branches:
            break
    return drafts


def test_continuations_equal_their_rule_on_random_haystacks():
    rng = np.random.default_rng(5)
    nonempty = 0
    for trial in range(1500):
        h = int(rng.integers(2, 60))
        haystack = rng.integers(-1, 5, size=h).astype(np.int64 if trial % 2 else np.int32)  # -1: a separator
        count = int(rng.integers(0, min(h - 1, 12) + 1))
        ends = np.sort(rng.choice(h - 1, size=count, replace=False)).astype(np.int64)
        lengths = rng.integers(1, 25, size=count).astype(np.int64)
        max_len, branches = int(rng.integers(1, 10)), int(rng.integers(1, 5))
        out = Proposals(["lookup"])
        out.writer("lookup")
        continuations(haystack, ends, lengths, max_len, branches, out)
        tokens, probs, drafted = out.flat()
        expected = _reference(haystack, ends, lengths, max_len, branches)
        assert drafted.tolist() == [len(t) for t, _ in expected], trial
        assert tokens.tolist() == [token for t, _ in expected for token in t], trial
        assert np.allclose(probs, [p for _, ps in expected for p in ps], rtol=0, atol=1e-15), trial
        nonempty += bool(expected)
    assert nonempty > 500  # most haystacks drafted something
