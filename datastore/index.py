"""Index a token stream: suffix array, Markov n-gram table, suffix trie, as files.

Input is the whole stream (shape (T,), uint16/uint32, separator-terminated
documents); output is the data files of ``retrieval_draft.store.layout`` written into a
directory. Memory peaks at about 20 bytes per token during the sort.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from retrieval_draft.errors import InvalidInputError
from retrieval_draft.store.arrow_io import write_table
from retrieval_draft.store.layout import NGRAM, SUFFIX_ARRAY, SUFFIX_RANGES, TOKENS, TRIE
from retrieval_draft.store.suffix_trie import build_trie, encode_rows, key_width
from retrieval_draft_datastore.kernels_count import capped_lcp, count_ngrams, trie_ranges, valid_lengths
from retrieval_draft_datastore.kernels_sort import sort_suffixes


@dataclass(frozen=True)
class IndexParams:
    """Build parameters (stored in the manifest).

    Attributes:
        max_order: longest Markov context, in tokens (1..15).
        top_k: next tokens kept per context.
        min_count: contexts with fewer continuations are dropped (orders >= 2).
        sort_depth: tokens the suffix array is sorted by = longest suffix match.
        trie_depth: longest n-gram keyed in the suffix trie.
        trie_min_count: n-grams of order >= 2 enter the trie from this many occurrences.
    """

    max_order: int = 4
    top_k: int = 4
    min_count: int = 2
    sort_depth: int = 16
    trie_depth: int = 2
    trie_min_count: int = 8

    def __post_init__(self) -> None:
        if not 1 <= self.max_order < self.sort_depth <= 255:
            raise InvalidInputError("need 1 <= max_order < sort_depth <= 255")
        if not 1 <= self.trie_depth <= self.sort_depth:
            raise InvalidInputError("need 1 <= trie_depth <= sort_depth")
        if self.top_k < 1 or self.min_count < 1 or self.trie_min_count < 1:
            raise InvalidInputError("top_k, min_count and trie_min_count must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)


def _ngram_columns(per_order: list[tuple], max_order: int, dtype: np.dtype) -> dict[str, np.ndarray]:
    """Stack the per-order tables into the columns of ngram.arrow (contexts zero-padded to max_order)."""
    order = np.concatenate([np.full(len(t[3]), n, np.uint8) for n, t in enumerate(per_order, 1)])
    ctx = np.zeros((order.size, max_order), dtype)
    row = 0
    for n, (c, _, _, _) in enumerate(per_order, 1):
        ctx[row : row + len(c), :n] = c
        row += len(c)
    return {
        "order": order,
        "context": ctx,
        "next": np.concatenate([t[1] for t in per_order]),
        "count": np.concatenate([t[2] for t in per_order]),
        "total": np.concatenate([t[3] for t in per_order]),
    }


def write_index(directory: Path, tokens: np.ndarray, vocab_size: int, sep: int, params: IndexParams) -> dict:
    """Write every data file of a datastore for ``tokens`` into ``directory``.

    Returns statistics: contexts per order, trie keys, seconds per phase.
    """
    seconds = {}
    start = time.perf_counter()
    write_table(directory / TOKENS, {"token": tokens})
    sa = sort_suffixes(tokens, params.sort_depth)
    seconds["sort"] = time.perf_counter() - start
    write_table(directory / SUFFIX_ARRAY, {"pos": sa})
    start = time.perf_counter()
    cap = max(params.max_order + 1, params.trie_depth)
    vlen = valid_lengths(tokens, sep, cap)
    lcp = capped_lcp(tokens, sa, vlen, cap)
    per_order = [count_ngrams(tokens, sa, lcp, vlen, n, params.top_k, params.min_count) for n in range(1, params.max_order + 1)]
    write_table(directory / NGRAM, _ngram_columns(per_order, params.max_order, tokens.dtype))
    seconds["count"] = time.perf_counter() - start
    start = time.perf_counter()
    lo, hi, dep = trie_ranges(sa, lcp, vlen, params.trie_depth, params.trie_min_count)
    write_table(directory / SUFFIX_RANGES, {"lo": lo, "hi": hi})
    firsts = sa[lo].astype(np.int64)[:, None] + np.arange(params.trie_depth)[None, :]
    key_ids = tokens[np.minimum(firsts, tokens.size - 1)]
    build_trie(encode_rows(key_ids, dep, key_width(vocab_size)), directory / TRIE)
    seconds["trie"] = time.perf_counter() - start
    return {
        "contexts_per_order": [int(len(t[3])) for t in per_order],
        "trie_keys": int(lo.size),
        "index_seconds": {k: round(v, 3) for k, v in seconds.items()},
    }
