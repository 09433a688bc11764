"""Prompt lookup: find the context's tail earlier in the context and propose what followed.

Several branches per step: every earlier occurrence of the last 1..max_ngram
tokens is a candidate, ranked by match length and then recency; the
continuations of the best few distinct candidates become separate drafts,
which the tree merges where they share a prefix.
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.draft import Drafter, Proposals
from retrieval_draft.drafters.tail_match import continuations, tail_matches


class PromptLookupDrafter(Drafter):
    """Drafts by copying from the context (prompt plus output so far).

    Args:
        max_ngram: longest tail matched, in tokens.
        min_ngram: shortest tail that counts as a match.
        max_branches: most distinct continuations proposed per step.
    """

    name = "prompt"
    prior_scale = 1.0  # tail-match probabilities are measured rates (tail_match.py)

    def __init__(self, max_ngram: int = 32, min_ngram: int = 1, max_branches: int = 4) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        if max_branches < 1:
            raise ValueError("max_branches must be at least 1")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_branches = max_branches

    def propose_into(self, context: np.ndarray, max_len: int, out: Proposals) -> None:
        """Up to ``max_branches`` continuations of ``context`` (shape (n,), int64)."""
        ends, lengths = tail_matches(context, context, self.max_ngram)
        keep = lengths >= self.min_ngram
        if keep.any():
            continuations(context, ends[keep], lengths[keep], max_len, self.max_branches, out)
