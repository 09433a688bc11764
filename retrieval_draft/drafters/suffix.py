"""SuffixDrafter: longest suffix match in the corpus, then frequency-weighted continuations.

Per propose: a binary search over the match length m (at most
``max_match`` <= the store's sort depth). Each probe finds the deepest trie
key that prefixes the last m context ids (one datrie ``longest_prefix_value``
call) and narrows its suffix-array range to all m ids (Numba binary search).
The longest matching suffix's occurrences are then sampled and turned into
``branches`` drafts (see ``retrieval_draft.store.query.suffix_drafts``).
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.draft import Draft
from retrieval_draft.drafters.base import Drafter
from retrieval_draft.store.query import narrow_range, suffix_drafts
from retrieval_draft.store.reader import Datastore
from retrieval_draft.store.suffix_trie import encode_ids


class SuffixDrafter(Drafter):
    """Drafts read from the corpus after the longest match of the context's end."""

    name = "suffix"

    def __init__(
        self, store: Datastore, *, max_match: int = 16, samples: int = 64, branches: int = 4, pseudo: float = 1.0
    ) -> None:
        depth = int(store.params["sort_depth"])
        if not 1 <= max_match <= depth:
            raise ValueError(f"max_match must be in 1..{depth} (the store's sort depth)")
        if samples < 1 or branches < 1:
            raise ValueError("samples and branches must be >= 1")
        if pseudo < 0:
            raise ValueError("pseudo must be >= 0")
        self._pseudo = float(pseudo)
        self._store = store
        self._max_match = int(max_match)
        self._samples = int(samples)
        self._branches = int(branches)
        self._trie_depth = int(store.params["trie_depth"])

    def _match_range(self, ids: np.ndarray) -> tuple[int, int] | None:
        """Suffix-array range of the occurrences of ``ids`` (int64, all < vocab), or None."""
        s = self._store
        row = s.trie.longest_prefix_value(encode_ids(ids[: self._trie_depth], s.key_width), None)
        if row is None:
            return None
        lo, hi = narrow_range(s.tokens, s.suffix_words, s.position_bits, int(s.range_lo[row]), int(s.range_hi[row]), ids)
        return (lo, hi) if hi > lo else None

    def longest_match(self, context: np.ndarray) -> tuple[int, int, int]:
        """(m, lo, hi): longest m such that context[-m:] occurs, and its range; m = 0 if none."""
        query = np.asarray(context, dtype=np.int64).reshape(-1)[-self._max_match :]
        bad = np.flatnonzero((query < 0) | (query >= self._store.vocab_size))
        if bad.size:  # ids unknown to the store cannot match
            query = query[bad[-1] + 1 :]
        best = (0, 0, 0)
        low, high = 1, query.size
        while low <= high:  # matching is monotone: a suffix of a match also matches
            m = (low + high) // 2
            found = self._match_range(query[-m:])
            if found is None:
                high = m - 1
            else:
                best = (m, found[0], found[1])
                low = m + 1
        return best

    def propose(self, context: np.ndarray, max_len: int) -> list[Draft]:
        """Up to ``branches`` continuations of at most ``max_len`` tokens; context shape (n,), int64."""
        if max_len < 1:
            return []
        m, lo, hi = self.longest_match(context)
        if m == 0:
            return []
        out_tok = np.zeros((self._branches, max_len), np.int64)
        out_prob = np.zeros((self._branches, max_len), np.float64)
        out_len = np.zeros(self._branches, np.int64)
        s = self._store
        n = suffix_drafts(s.tokens, s.suffix_words, s.position_bits, lo, hi, m, s.separator, self._samples,
                          self._branches, self._pseudo, out_tok, out_prob, out_len)
        return [Draft(out_tok[i, : out_len[i]], out_prob[i, : out_len[i]]) for i in range(n)]
