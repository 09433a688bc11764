"""The n-gram table of a sharded store, counted across its shards by first-token range.

A one-shard build counts its table from one suffix array (``index``). The
shards' suffix arrays are each sorted the same way, so the rows of all shards
whose first token is in a range [c0, c1) can be merged into the order one
suffix array over the whole corpus would give them (``kernels_merge``; only
the first ``max_order + 1`` tokens matter for counting, so each row is copied
as a short window and the windows are merged, never the shards' streams).
Counting the merged rows with the same kernel (``kernels_count.count_ngrams``)
and concatenating the ranges in key order gives exactly the one-shard table:
the same contexts, top-k, counts and totals, the same bytes once written. The
same merged rows give the contexts too rare for the table that still draft and
the shards holding each, which make each shard's rare-context filter
(``retrieval_draft.store.rare_filter``).

Memory: one range at a time, about 30 bytes per suffix-array row of the range
(``table_cuts`` sizes the ranges); the shards are read memory-mapped. The
ranges are independent, so a distributed build counts them on many workers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit

from retrieval_draft.store.packed import position_at
from retrieval_draft.store.rare_filter import context_hash
from retrieval_draft.store.opening import open_datastore
from retrieval_draft_datastore.index import IndexParams
from retrieval_draft_datastore.kernels_count import capped_lcp, count_ngrams, valid_lengths
from retrieval_draft_datastore.kernels_merge import merge_runs

RANGE_ROWS = 1 << 23  # suffix-array rows per counted range (all shards together), ~250 MB of work memory


def table_cuts(bucket_rows: np.ndarray, max_rows: int = RANGE_ROWS) -> np.ndarray:
    """First ids of contiguous id ranges of at most ``max_rows`` rows each (one id's bucket may be
    bigger: it is never split). ``bucket_rows``: (vocab,) rows per first id over all shards.
    Returns (P + 1,) int64 bounds, 0 first and vocab last."""
    cuts = [0]
    rows = 0
    for t, size in enumerate(bucket_rows.tolist()):
        if rows and rows + size > max_rows:
            cuts.append(t)
            rows = 0
        rows += size
    cuts.append(bucket_rows.size)
    return np.asarray(cuts, np.int64)


@njit(cache=True)
def _windows(tokens, words, bits, lo, hi, width, sep, out, start) -> None:
    """Write the first ``width`` tokens of suffix-array rows lo..hi-1 into ``out`` from row
    ``start``: row r at out[r * (width + 1):], separator after a separator and at the end."""
    for j in range(lo, hi):
        p = position_at(words, bits, j)
        base = (start + j - lo) * (width + 1)
        ended = False
        for k in range(width):
            t = tokens[p + k] if not ended else sep
            ended = ended or t == sep
            out[base + k] = t
        out[base + width] = sep


@njit(cache=True)
def _rare_pairs(local, merged, lcp, svl, n, min_count, table_min, width, starts, out_shard, out_hash) -> int:
    """(shard, context hash) pairs of the order-n contexts with ``min_count`` <= continuations <
    ``table_min``: one pair per shard that holds a row of the context. ``starts``: (S + 1,) first
    window of each shard in ``local`` (row r of ``merged`` is window merged[r] // (width + 1)).
    Writes into out_shard/out_hash (>= merged.size each); returns the pairs written."""
    seen = np.full(starts.size - 1, -1, np.int64)
    ids = np.empty(n, np.int64)
    pairs = 0
    j = 0
    while j < merged.size:
        if svl[j] < n:
            j += 1
            continue
        end = j + 1
        while end < lcp.size and lcp[end] >= n:
            end += 1
        total = 0
        if end - j >= min_count:  # the group's size bounds its continuations
            for r in range(j, end):
                total += svl[r] > n
        if min_count <= total < table_min:
            for k in range(n):
                ids[k] = local[merged[j] + k]
            h = context_hash(ids)
            for r in range(j, end):
                shard = np.searchsorted(starts, merged[r] // (width + 1), side="right") - 1
                if seen[shard] != j:
                    seen[shard] = j
                    out_shard[pairs] = shard
                    out_hash[pairs] = h
                    pairs += 1
        j = end
    return pairs


def count_range(shard_dirs: list[Path], c0: int, c1: int, params: IndexParams) -> tuple[list[tuple], tuple]:
    """The table rows (per order n = 1..max_order: ctx, nxt, cnt, tot as ``count_ngrams`` returns
    them) of the contexts whose first id is in [c0, c1), counted over every shard, and for those
    that draft but are too rare for the table, (shard (K,) int64, hash (K,) uint64) pairs: one per
    shard holding the context (``rare_filter.context_hash``)."""
    width = params.max_order + 1
    shards = [open_datastore(d, verify=False) for d in shard_dirs]
    spans = [(int(s.range_lo[c0]), int(s.range_hi[c1 - 1])) for s in shards]
    rows = sum(hi - lo for lo, hi in spans)
    dtype = shards[0].tokens.dtype
    sep = shards[0].separator
    local = np.empty(rows * (width + 1) + 1, dtype)
    local[-1] = sep
    runs, start = [], 0
    for shard, (lo, hi) in zip(shards, spans):
        _windows(shard.tokens, shard.suffix_words, shard.position_bits, lo, hi, width, sep, local, start)
        runs.append((np.arange(start, start + hi - lo, dtype=np.int64) * (width + 1)).astype(np.uint32))
        start += hi - lo
    del shards
    merged = merge_runs(local, runs, width, sep)
    vlen = valid_lengths(local, sep, width)
    lcp = capped_lcp(local, merged, vlen, width)
    svl = vlen[merged]
    table_min = max(params.min_count, params.table_min_total)
    starts = np.asarray([0, *np.cumsum([hi - lo for lo, hi in spans])], np.int64)
    out_shard, out_hash = np.empty(merged.size, np.int64), np.empty(merged.size, np.uint64)
    table, shards, hashes = [], [], []
    for n in range(1, params.max_order + 1):
        table.append(count_ngrams(local, merged, lcp, svl, n, params.top_k, table_min))
        pairs = _rare_pairs(local, merged, lcp, svl, n, params.min_count, table_min, width, starts, out_shard, out_hash)
        shards.append(out_shard[:pairs].copy())
        hashes.append(out_hash[:pairs].copy())
    return table, (np.concatenate(shards), np.concatenate(hashes))


def bucket_rows(shard_dirs: list[Path], vocab_size: int) -> np.ndarray:
    """(vocab,) int64: suffix-array rows per first id, summed over the shards."""
    total = np.zeros(vocab_size, np.int64)
    for d in shard_dirs:
        shard = open_datastore(d, verify=False)
        total += shard.range_hi[:vocab_size].astype(np.int64) - shard.range_lo[:vocab_size]
    return total


def join_ranges(parts: list[list[tuple]], max_order: int) -> list[tuple]:
    """Per order, the rows of every range concatenated in range order (= key order)."""
    return [tuple(np.concatenate([p[n][f] for p in parts]) for f in range(4)) for n in range(max_order)]
