"""NgramDrafter: expand the datastore's Markov model into a small token tree.

From the longest context (up to ``max_order`` tokens, seen at least the
store's ``min_count`` times; frequent ones read from the n-gram table, rare
ones counted from the suffix array) that ends the
current context, take the top ``widths[0]`` next tokens, then for each
recurse with the extended context keeping ``widths[1]`` children, and so on
(widths past the tuple are 1: greedy). Each root-to-leaf path is one Draft;
``probs[i] = count(next) / (total(context) + pseudo)`` at that level, so a
context seen once is not taken for a certainty. One Numba call
per propose, over every shard of a sharded store (the merge rule that
gives exactly the one-shard drafts: ``retrieval_draft.store.query.context_row``).
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.draft import Drafter, Proposals
from retrieval_draft.store.query import ngram_drafts
from retrieval_draft.store.reader import Datastore
from retrieval_draft.store.sharded import ShardedDatastore


class NgramDrafter(Drafter):
    """Drafts from the Markov n-gram table of an open datastore."""

    name = "ngram"

    def __init__(
        self,
        store: Datastore | ShardedDatastore,
        *,
        widths: tuple[int, ...] = (4, 2),
        max_drafts: int = 16,
        pseudo: float = 1.0,
        max_depth: int = 12,
    ) -> None:
        if not widths or min(widths) < 1 or max_drafts < 1 or max_depth < 1:
            raise ValueError("widths must be non-empty positive ints, max_drafts and max_depth >= 1")
        if pseudo < 0:
            raise ValueError("pseudo must be >= 0")
        self._pseudo = float(pseudo)
        self._table = store.ngrams.as_kernel_tuple()
        self._store = store.kernel_arrays
        self._max_order = int(store.params["max_order"])
        self._widths = tuple(int(w) for w in widths)
        self._max_drafts = int(max_drafts)
        # Markov chains lose confidence fast: past a dozen tokens a path's
        # probability is too small to be verified, so expanding it is waste.
        self._max_depth = int(max_depth)

    def propose_into(self, context: np.ndarray, max_len: int, out: Proposals) -> None:
        """Up to ``max_drafts`` paths of at most ``min(max_len, max_depth)`` tokens; context shape (n,), int64."""
        context = np.asarray(context, dtype=np.int64).reshape(-1)
        max_len = min(max_len, self._max_depth)
        if max_len < 1 or context.size == 0:
            return
        widths = np.ones(max_len, np.int64)
        widths[: min(max_len, len(self._widths))] = self._widths[:max_len]
        out_tok = np.empty((self._max_drafts, max_len), np.int64)
        out_prob = np.empty((self._max_drafts, max_len), np.float64)
        out_len = np.empty(self._max_drafts, np.int64)
        n = ngram_drafts(context[-self._max_order :], self._table, self._store, widths, self._pseudo,
                         out_tok, out_prob, out_len)
        out.add_padded(out_tok, out_prob, out_len, n)

