"""SuffixDrafter: longest suffix match in the corpus, then frequency-weighted continuations.

Per propose, two Numba calls over every shard of the store (one for a flat
store): a binary search over the match length m (at most ``max_match`` <= the
store's sort depth), each probe narrowing the first-token range of the last m
context ids to all m of them; then the longest matching suffix's occurrences
are sampled and turned into ``branches`` drafts
(``retrieval_draft.store.suffix_query``, which states the sampling rule across
shards).
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.draft import Drafter, Proposals
from retrieval_draft.store.reader import Datastore
from retrieval_draft.store.sharded import ShardedDatastore
from retrieval_draft.store.suffix_query import longest_match, suffix_drafts


MAX_MATCH = 16  # default longest suffix match, tokens (a store's sort depth may cap it lower)


class SuffixDrafter(Drafter):
    """Drafts read from the corpus after the longest match of the context's end."""

    name = "suffix"

    def __init__(
        self, store: Datastore | ShardedDatastore, *, max_match: int | None = None, samples: int = 64,
        branches: int = 4, pseudo: float = 1.0
    ) -> None:
        """``max_match``: longest suffix matched, in tokens, 1..the store's sort depth (default:
        ``MAX_MATCH`` or the sort depth, whichever is smaller, so a store built with any accepted
        ``--sort-depth`` drafts)."""
        depth = int(store.params["sort_depth"])
        if max_match is None:
            max_match = min(MAX_MATCH, depth)
        if not 1 <= max_match <= depth:
            raise ValueError(f"max_match must be in 1..{depth} (the store's sort depth)")
        if samples < 1 or branches < 1:
            raise ValueError("samples and branches must be >= 1")
        if pseudo < 0:
            raise ValueError("pseudo must be >= 0")
        self._pseudo = float(pseudo)
        self._vocab_size = store.vocab_size
        self._arrays = store.kernel_arrays
        self._shards = len(store.shards)
        self._max_match = int(max_match)
        self._samples = int(samples)
        self._branches = int(branches)

    def _match(self, context: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        """(m, lo (S,), hi (S,)): longest m such that context[-m:] occurs in some shard, and each
        shard's suffix-array range of it; m = 0 if none."""
        query = np.asarray(context, dtype=np.int64).reshape(-1)[-self._max_match :]
        bad = np.flatnonzero((query < 0) | (query >= self._vocab_size))
        if bad.size:  # ids unknown to the store cannot match
            query = query[bad[-1] + 1 :]
        lo = np.zeros(self._shards, np.int64)
        hi = np.zeros(self._shards, np.int64)
        return longest_match(self._arrays, query, lo, hi), lo, hi

    def longest_match(self, context: np.ndarray) -> tuple[int, int]:
        """(m, occurrences): longest m such that context[-m:] occurs, and how often; m = 0 if none."""
        m, lo, hi = self._match(context)
        return m, int((hi - lo).sum())

    def propose_into(self, context: np.ndarray, max_len: int, out: Proposals) -> None:
        """Up to ``branches`` continuations of at most ``max_len`` tokens; context shape (n,), int64."""
        if max_len < 1:
            return
        m, lo, hi = self._match(context)
        if m == 0:
            return
        out_tok = np.zeros((self._branches, max_len), np.int64)
        out_prob = np.zeros((self._branches, max_len), np.float64)
        out_len = np.zeros(self._branches, np.int64)
        n = suffix_drafts(self._arrays, lo, hi, m, self._samples, self._branches, self._pseudo,
                          out_tok, out_prob, out_len)
        out.add_padded(out_tok, out_prob, out_len, n)
