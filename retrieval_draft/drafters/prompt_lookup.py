"""Prompt lookup: find the context's tail earlier in the context and propose what followed.

Several branches per step: every earlier occurrence of the last 1..max_ngram
tokens is a candidate, ranked by match length and then recency; the
continuations of the best few distinct candidates become separate drafts,
which the tree merges where they share a prefix.
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.drafters.base import Draft, Drafter

# Estimated probability that the first copied token is accepted, by match
# length (index = tokens matched, capped at the last entry).
_FIRST_TOKEN_PROB = (0.0, 0.25, 0.4, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8)
_NEXT_TOKEN_PROB = 0.85


class PromptLookupDrafter(Drafter):
    """Drafts by copying from the context (prompt plus output so far).

    Args:
        max_ngram: longest tail matched, in tokens.
        min_ngram: shortest tail that counts as a match.
        max_branches: most distinct continuations proposed per step.
    """

    name = "prompt_lookup"

    def __init__(self, max_ngram: int = 8, min_ngram: int = 1, max_branches: int = 4) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        if max_branches < 1:
            raise ValueError("max_branches must be at least 1")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_branches = max_branches

    def propose(self, context: np.ndarray, max_len: int) -> list[Draft]:
        """Up to ``max_branches`` continuations of ``context`` (shape (n,), int64)."""
        starts, lengths = self._matches(context)
        if starts.size == 0:
            return []
        order = np.lexsort((-starts, -lengths))  # longest match first, then most recent
        starts, lengths = starts[order], lengths[order]
        next_tokens = context[starts + 1]
        drafts: list[Draft] = []
        seen: set[tuple[int, ...]] = set()
        for start, length in zip(starts.tolist(), lengths.tolist()):
            tokens = context[start + 1 : start + 1 + max_len]
            key = tuple(tokens.tolist())
            if key in seen:
                continue
            seen.add(key)
            same_level = lengths >= length
            share = np.count_nonzero(next_tokens[same_level] == tokens[0]) / np.count_nonzero(same_level)
            first = _FIRST_TOKEN_PROB[min(length, len(_FIRST_TOKEN_PROB) - 1)] * share
            probs = np.full(tokens.shape[0], _NEXT_TOKEN_PROB)
            probs[0] = max(first, 1e-3)
            drafts.append(Draft(tokens, probs))
            if len(drafts) == self.max_branches:
                break
        return drafts

    def _matches(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Earlier end positions of the context's tail and the match length at each.

        Returns (ends, lengths): ``context[end - length + 1 : end + 1]`` equals
        the last ``length`` tokens, ``end < n - 1`` so at least one token
        follows, and ``length >= min_ngram``.
        """
        n = context.shape[0]
        if n < 2:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        ends = np.flatnonzero(context[: n - 1] == context[n - 1])
        lengths = np.ones(ends.shape[0], dtype=np.int64)
        alive = np.ones(ends.shape[0], dtype=bool)
        for back in range(1, self.max_ngram):
            if back >= n:
                break
            probe = ends - back
            ok = alive & (probe >= 0)
            ok[ok] = context[probe[ok]] == context[n - 1 - back]
            lengths += ok
            alive = ok
            if not alive.any():
                break
        keep = lengths >= self.min_ngram
        return ends[keep], lengths[keep]
