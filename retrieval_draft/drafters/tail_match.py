"""Find where the tail of a context occurred before, and what followed it.

Shared by prompt lookup (search the context itself) and the output history
(search earlier generations). Vectorised over candidate positions: one
comparison over the haystack, then one masked step per extra matched token.
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.drafters.base import Draft

# Estimated probability that the first copied token is accepted, by match
# length (index = tokens matched, capped at the last entry). Calibrated online
# by the engine; these are only starting points.
FIRST_TOKEN_PROB = (0.0, 0.25, 0.4, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8)
NEXT_TOKEN_PROB = 0.85


def tail_matches(haystack: np.ndarray, tail: np.ndarray, max_ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``haystack`` where the end of ``tail`` occurs, with match lengths.

    Args:
        haystack: shape (h,), int64 tokens searched (negative ids never match).
        tail: shape (t,), int64; its last token must match at the position.
        max_ngram: longest match measured.

    Returns:
        (ends, lengths), both shape (c,): ``haystack[end - L + 1 : end + 1]``
        equals ``tail[-L:]`` for ``L = lengths[i]``, and ``end < h - 1`` so at
        least one token follows.
    """
    h, t = haystack.shape[0], tail.shape[0]
    if h < 2 or t < 1:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    ends = np.flatnonzero(haystack[: h - 1] == tail[t - 1])
    lengths = np.ones(ends.shape[0], dtype=np.int64)
    alive = np.ones(ends.shape[0], dtype=bool)
    for back in range(1, min(max_ngram, t)):
        probe = ends - back
        ok = alive & (probe >= 0)
        ok[ok] = haystack[probe[ok]] == tail[t - 1 - back]
        lengths += ok
        alive = ok
        if not alive.any():
            break
    return ends, lengths


def continuations(
    haystack: np.ndarray, ends: np.ndarray, lengths: np.ndarray, max_len: int, max_branches: int
) -> list[Draft]:
    """Distinct continuations after the best matches: longest match first, then most recent.

    A continuation stops before a negative id (a document separator). The first
    token's probability grows with the match length and is shared among the
    matches of at least that length by how many of them continue with it.
    """
    order = np.lexsort((-ends, -lengths))
    ends, lengths = ends[order], lengths[order]
    next_tokens = haystack[ends + 1]
    drafts: list[Draft] = []
    seen: set[tuple[int, ...]] = set()
    for end, length in zip(ends.tolist(), lengths.tolist()):
        tokens = haystack[end + 1 : end + 1 + max_len]
        stop = np.flatnonzero(tokens < 0)
        if stop.size:
            tokens = tokens[: stop[0]]
        key = tuple(tokens.tolist())
        if not key or key in seen:
            continue
        seen.add(key)
        level = lengths >= length
        share = np.count_nonzero(next_tokens[level] == tokens[0]) / np.count_nonzero(level)
        probs = np.full(tokens.shape[0], NEXT_TOKEN_PROB)
        probs[0] = max(FIRST_TOKEN_PROB[min(length, len(FIRST_TOKEN_PROB) - 1)] * share, 1e-3)
        drafts.append(Draft(tokens, probs))
        if len(drafts) == max_branches:
            break
    return drafts
