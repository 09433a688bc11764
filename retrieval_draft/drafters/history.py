"""Learning from outputs: earlier prompts and generations become a draft source.

Every finished generation (its prompt and output, as one document) is
appended to a bounded token buffer; later generations copy from it like
prompt lookup does from the context. Repeated or similar tasks get faster
over time (the idea behind SuffixDecoding's and llama.cpp's dynamic caches).

Memory: at most ``max_tokens`` int32 ids (4 bytes each, 4 MB for the
default million) plus one separator per document. When full, the oldest
half is evicted at once, so appending stays amortised O(1).
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.drafters.base import Draft, Drafter
from retrieval_draft.drafters.tail_match import continuations, tail_matches

SEPARATOR = -1


class HistoryDrafter(Drafter):
    """Drafts from earlier generations of this process (or of whoever shares the instance).

    Args:
        max_tokens: buffer capacity in tokens.
        min_ngram: shortest tail that counts as a match (history is larger
            and noisier than the context, so the default asks for 2).
        max_ngram: longest tail matched.
        max_branches: most continuations per step.
    """

    name = "history"
    prior_scale = 1.0  # tail-match probabilities are measured rates (tail_match.py)

    def __init__(self, max_tokens: int = 1_000_000, min_ngram: int = 2, max_ngram: int = 32, max_branches: int = 3) -> None:
        if max_tokens < 16:
            raise ValueError("max_tokens must be at least 16")
        self.max_tokens = max_tokens
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.max_branches = max_branches
        self._buffer = np.empty(0, dtype=np.int32)
        self._prompt = np.empty(0, dtype=np.int64)

    @property
    def size(self) -> int:
        """Tokens held, separators included."""
        return int(self._buffer.shape[0])

    def begin(self, prompt: np.ndarray) -> None:
        self._prompt = np.asarray(prompt, dtype=np.int64)

    def end(self, output: np.ndarray) -> None:
        """Store the prompt and output of the generation that just finished."""
        self.add(np.concatenate([self._prompt, np.asarray(output, dtype=np.int64)]))

    def add(self, document: np.ndarray) -> None:
        """Append one document (shape (n,), ids >= 0), evicting the oldest half when full."""
        document = np.asarray(document, dtype=np.int32)[-(self.max_tokens - 1) :]
        grown = np.concatenate([self._buffer, document, [SEPARATOR]]).astype(np.int32)
        if grown.shape[0] > self.max_tokens:
            cut = grown.shape[0] - self.max_tokens // 2
            separators = np.flatnonzero(grown[:cut] == SEPARATOR)
            start = int(separators[-1]) + 1 if separators.size else cut
            grown = grown[start:]
        self._buffer = grown

    def propose(self, context: np.ndarray, max_len: int) -> list[Draft]:
        if self._buffer.shape[0] < 2:
            return []
        ends, lengths = tail_matches(self._buffer, context, self.max_ngram)
        keep = lengths >= self.min_ngram
        if not keep.any():
            return []
        return continuations(self._buffer, ends[keep], lengths[keep], max_len, self.max_branches)
