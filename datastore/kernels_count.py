"""Numba kernels that count n-grams from a suffix array sorted to depth >= max_order + 1.

In the sorted array every context (n tokens) is one contiguous group and,
inside it, each next token is one contiguous run, so counting is a linear
scan over two per-row arrays: ``lcp[j]``, the separator-free common prefix
of rows j-1 and j, and ``svl[j]``, the separator-free length of row j's
suffix, both capped (``kernels_sort`` yields them with the sort; for merged
rows ``capped_lcp`` and ``valid_lengths`` compute them). Counts never cross
a separator. The scans read the stream only at the start of each run of a
group they keep.
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit

from retrieval_draft.store.query import insert_top_k
from retrieval_draft_datastore.kernel_threads import even_slices, on_threads


@njit(cache=True)
def valid_lengths(tokens: np.ndarray, sep: int, cap: int) -> np.ndarray:
    """vlen[i] = number of tokens before the next separator from i, capped at ``cap``; (n,), uint8."""
    n = tokens.size
    vlen = np.empty(n, np.uint8)
    run = 0
    for i in range(n - 1, -1, -1):
        if tokens[i] == sep:
            run = 0
        elif run < cap:
            run += 1
        vlen[i] = run
    return vlen


@njit(cache=True, nogil=True)
def _lcp_rows(j0, j1, tokens, sa, vlen, cap, lcp) -> None:
    """lcp[j] for rows j in [max(j0, 1), j1) (one thread's slice of ``capped_lcp``)."""
    for j in range(max(j0, 1), j1):
        a = sa[j - 1]
        b = sa[j]
        limit = min(vlen[a], vlen[b], cap)
        k = 0
        while k < limit and tokens[a + k] == tokens[b + k]:
            k += 1
        lcp[j] = k


def capped_lcp(tokens: np.ndarray, sa: np.ndarray, vlen: np.ndarray, cap: int) -> np.ndarray:
    """lcp[j] = common prefix of suffixes sa[j-1], sa[j] (separator-free, <= cap); (n,), uint8."""
    lcp = np.zeros(sa.size, np.uint8)
    on_threads(_lcp_rows, even_slices(sa.size, get_num_threads()), tokens, sa, vlen, np.int64(cap), lcp)
    return lcp


@njit(cache=True, nogil=True)
def _group_end(lcp: np.ndarray, start: int, n_tokens: int) -> int:
    """End (exclusive) of the group starting at ``start`` whose members share >= n_tokens tokens."""
    end = start + 1
    while end < lcp.size and lcp[end] >= n_tokens:
        end += 1
    return end


@njit(cache=True, nogil=True)
def _top_runs(tokens, sa, lcp, svl, g0, g1, n, top_k, out_tok, out_cnt) -> int:
    """Top-k next tokens (by count, then id) of the order-n group [g0, g1); returns their total."""
    for k in range(top_k):
        out_tok[k] = 0
        out_cnt[k] = 0
    total = 0
    j = g0
    while j < g1:
        if svl[j] <= n:  # next token is a separator: these sort last in the group
            break
        end = j + 1
        while end < g1 and lcp[end] >= n + 1:
            end += 1
        total += end - j
        insert_top_k(np.int64(tokens[sa[j] + n]), end - j, out_tok, out_cnt)
        j = end
    return total


@njit(cache=True, nogil=True)
def scan_order(tokens, sa, lcp, svl, n, top_k, min_count, ctx, nxt, cnt, tot, fill) -> int:
    """Rows of the order-n Markov table: contexts with >= min_count continuations.

    With ``fill`` the rows are written: ctx (R, n) context ids, nxt/cnt (R, top_k)
    next ids and counts (count 0 = unused slot), tot (R,) continuations in
    total. Rows come in lexicographic context order. Returns R.
    """
    buf_tok = np.zeros(top_k, np.int64)
    buf_cnt = np.zeros(top_k, np.int64)
    rows = 0
    j = np.int64(0)  # not a literal: _top_runs compiles once
    size = sa.size
    while j < size:
        if svl[j] < n:
            j += 1
            continue
        end = _group_end(lcp, j, n)
        if end - j < min_count:  # the group's size bounds its continuations: skip without reading
            j = end
            continue
        total = _top_runs(tokens, sa, lcp, svl, j, end, n, top_k, buf_tok, buf_cnt)
        if total >= min_count and total > 0:
            if fill:
                p = sa[j]
                for k in range(n):
                    ctx[rows, k] = tokens[p + k]
                for k in range(top_k):
                    nxt[rows, k] = buf_tok[k]
                    cnt[rows, k] = buf_cnt[k]
                tot[rows] = total
            rows += 1
        j = end
    return rows


@njit(cache=True, nogil=True)
def prefix_ranges(lcp, svl, depth, min_count, lo, hi, dep, fill) -> int:
    """Suffix-array ranges of every n-gram, n = 1..depth, in lexicographic key order.

    An n-gram of order >= 2 is kept when it occurs >= min_count times; every
    unigram is kept. With ``fill``: lo/hi (R,) half-open range, dep (R,) n.
    Parents precede their extensions, so keys come out sorted. Returns R.
    """
    rows = 0
    size = lcp.size
    for j in range(size):
        for d in range(1, depth + 1):
            if svl[j] < d or (j > 0 and lcp[j] >= d):
                continue
            end = _group_end(lcp, j, d)
            if d == 1 or end - j >= min_count:
                if fill:
                    lo[rows] = j
                    hi[rows] = end
                    dep[rows] = d
                rows += 1
    return rows


def count_ngrams(tokens, sa, lcp, svl, order, top_k, min_count):
    """The order-n table as numpy arrays (ctx (R, n), nxt (R, K), cnt (R, K) uint32, tot (R,) uint32):
    every context with >= ``min_count`` continuations."""
    # The counting pass's empty outputs have the filling pass's dtypes: one compiled kernel serves both.
    ids, counts = np.zeros((0, 0), tokens.dtype), np.zeros((0, 0), np.uint32)
    rows = scan_order(tokens, sa, lcp, svl, order, top_k, min_count, ids, ids, counts, np.zeros(0, np.uint32), False)
    ctx = np.zeros((rows, order), tokens.dtype)
    nxt = np.zeros((rows, top_k), tokens.dtype)
    cnt = np.zeros((rows, top_k), np.uint32)
    tot = np.zeros(rows, np.uint32)
    scan_order(tokens, sa, lcp, svl, order, top_k, min_count, ctx, nxt, cnt, tot, True)
    return ctx, nxt, cnt, tot


def trie_ranges(lcp, svl, depth, min_count):
    """Rows for the suffix trie: (lo (R,) uint32, hi (R,) uint32, dep (R,) uint8), keys sorted."""
    ends = np.zeros(0, np.uint32)  # the counting pass's empty outputs, typed as the filling pass's
    rows = prefix_ranges(lcp, svl, depth, min_count, ends, ends, np.zeros(0, np.uint8), False)
    lo = np.zeros(rows, np.uint32)
    hi = np.zeros(rows, np.uint32)
    dep = np.zeros(rows, np.uint8)
    prefix_ranges(lcp, svl, depth, min_count, lo, hi, dep, True)
    return lo, hi, dep
