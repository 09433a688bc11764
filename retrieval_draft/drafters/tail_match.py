"""Find where the tail of a context occurred before, and what followed it.

Shared by prompt lookup (search the context itself) and the output history
(search earlier generations). One vectorised comparison over the haystack finds
every occurrence of the tail's last token; one compiled loop extends each match
backwards (no temporary array per matched token).
"""

from __future__ import annotations

import numba
import numpy as np

from retrieval_draft.draft import Proposals

# Starting estimates of how likely a copied token is accepted, by the length
# of the tail match behind it; band b covers match lengths from
# MATCH_LENGTH_BANDS[b] up to the next edge. FIRST_TOKEN_PROB is for the first
# copied token. The i-th later token, given the earlier ones were right,
# extends a match of length L + i, so it gets NEXT_TOKEN_PROB of that band.
# Long matches mean the model is copying (a file being reproduced, a loop
# repeating), and then nearly every token is accepted. The engine calibrates
# these online. The values are fit_priors' measurements (git show 8f31bf5:tools/diagnostics/fit_priors.py) on
# held-out prompts with SmolLM2-135M (made monotone; band 0 of NEXT is unused).
MATCH_LENGTH_BANDS = np.array([1, 2, 3, 4, 5, 7, 11, 21])
FIRST_TOKEN_PROB = np.array([0.22, 0.55, 0.7, 0.77, 0.78, 0.88, 0.9, 0.98])
NEXT_TOKEN_PROB = np.array([0.6, 0.62, 0.71, 0.79, 0.79, 0.89, 0.9, 0.97])


def tail_matches(haystack: np.ndarray, tail: np.ndarray, max_ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``haystack`` where the end of ``tail`` occurs, with match lengths.

    Args:
        haystack: shape (h,), int32 or int64 tokens searched (negative ids never match).
        tail: shape (t,), int64; its last token must match at the position.
        max_ngram: longest match measured.

    Returns:
        (ends, lengths), both shape (c,) int64, ends increasing: ``haystack[end - L + 1 : end + 1]``
        equals ``tail[-L:]`` for ``L = lengths[i]``, and ``end < h - 1`` so at
        least one token follows.
    """
    h, t = haystack.shape[0], tail.shape[0]
    if h < 2 or t < 1:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    ends = np.flatnonzero(haystack[: h - 1] == tail[-1])
    return ends, match_lengths(haystack, tail, ends, max_ngram)


def match_lengths(haystack: np.ndarray, tail: np.ndarray, ends: np.ndarray, max_ngram: int) -> np.ndarray:
    """(c,) int64: how many of ``tail``'s last tokens (at most ``max_ngram``) occur in
    ``haystack`` (h,) ending at each of ``ends`` (c,), positions that hold ``tail[-1]``
    (``tail_matches``' lengths, for ends found some other way: an index)."""
    tail = np.ascontiguousarray(tail[-min(max_ngram, tail.shape[0]) :], dtype=np.int64)
    return _match_lengths(haystack, tail, ends)


@numba.njit(cache=True, nogil=True)
def _match_lengths(haystack: np.ndarray, tail: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """(c,) int64: how many of ``tail``'s (t,) tokens match backwards from each of ``ends`` (c,),
    positions in ``haystack`` (h,) that hold ``tail``'s last token (1..t)."""
    t = tail.shape[0]
    lengths = np.empty(ends.shape[0], np.int64)
    for i in range(ends.shape[0]):
        p, length = ends[i], 1
        while length < t and p - length >= 0 and haystack[p - length] == tail[t - 1 - length]:
            length += 1
        lengths[i] = length
    return lengths


def continuations(
    haystack: np.ndarray, ends: np.ndarray, lengths: np.ndarray, max_len: int, max_branches: int, out: Proposals
) -> None:
    """Distinct continuations after the best matches, written into ``out``: longest match
    first, then most recent, at most ``max_branches``.

    A continuation stops before a negative id (a document separator). Every
    token's probability grows with the match length; the first token's is also
    shared among the matches of at least that length by how many of them
    continue with it. One compiled pass (``_continuations``) reads every match.
    """
    order = np.lexsort((-ends, -lengths))
    tokens, probs, counts = _continuations(haystack, ends[order], lengths[order], max_len, max_branches,
                                           MATCH_LENGTH_BANDS, FIRST_TOKEN_PROB, NEXT_TOKEN_PROB)
    out.add_flat(tokens, probs, counts)


@numba.njit(cache=True, nogil=True)
def _continuations(haystack, ends, lengths, max_len, max_branches, bands, first_prob, next_prob):  # pragma: no cover - compiled
    """``continuations``' drafts, laid end to end: tokens (m,) int64, probabilities (m,) float64 and
    each draft's length (d,) int64. ``ends`` / ``lengths`` (c,): the matches, longest first, then
    most recent; ``bands``, ``first_prob``, ``next_prob``: the tables above."""
    c = ends.shape[0]
    tokens = np.empty(max_branches * max_len, np.int64)
    probs = np.empty(max_branches * max_len, np.float64)
    counts = np.empty(max_branches, np.int64)
    written, used = 0, 0
    for i in range(c):
        if written == max_branches:
            break
        start = ends[i] + 1
        n = 0
        while n < max_len and start + n < haystack.shape[0] and haystack[start + n] >= 0:
            n += 1
        if n == 0:
            continue
        seen = False  # the same continuation as an earlier draft's
        at = 0
        for d in range(written):
            if counts[d] == n:
                same = True
                for j in range(n):
                    if tokens[at + j] != haystack[start + j]:
                        same = False
                        break
                if same:
                    seen = True
                    break
            at += counts[d]
        if seen:
            continue
        first = haystack[start]
        level = 0  # matches at least this long, and of those, the ones continuing with ``first``
        agree = 0
        for k in range(c):
            if lengths[k] >= lengths[i]:
                level += 1
                if haystack[ends[k] + 1] == first:
                    agree += 1
        for j in range(n):
            effective = lengths[i] + j  # the match length behind this token
            band = 0
            while band + 1 < bands.shape[0] and bands[band + 1] <= effective:
                band += 1
            tokens[used + j] = haystack[start + j]
            probs[used + j] = next_prob[band]
            if j == 0:
                probs[used] = max(first_prob[band] * (agree / level), 1e-3)
        counts[written] = n
        used += n
        written += 1
    return tokens[:used], probs[:used], counts[:written]
