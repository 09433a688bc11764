"""Numba kernel: sort every stream position by the tokens that start there.

Bucketed most-significant-first sort, buckets spread over Numba's thread count
by size (``kernel_threads``):

1. A counting pass puts every position in the bucket of its first token
   (positions ascending inside a bucket).
2. Inside a bucket one *window* of the next ``2w`` tokens (``w`` = 4 uint16
   or 2 uint32 ids per 64-bit word, one cache miss) is read per position and
   the bucket is ordered by the window's first word, runs of equal first
   words by the second: the order to depth ``1 + 2w``. The windows also give,
   free of further reads, each row's common prefix with its neighbour and
   its separator-free length, capped at ``1 + 2w`` (``lcp``/``svl``, what
   ``kernels_count`` scans).
3. Runs still equal over ``1 + 2w`` tokens (about half of a code corpus,
   mostly copies of the same files) need ``r = depth - 1 - 2w`` more tokens.
   When ``r <= 1 + 2w`` one *rank round* finishes them: from lcp/svl every
   position gets the rank of its group at depth ``r``, and each tied run is
   sorted by ``rank_r[p + 1 + 2w]``, one 4-byte read per position, which
   orders exactly the next ``r`` tokens. Deeper sorts read further windows
   run by run instead.

Every sort is stable, so ties keep stream order. The key of a position stops
at its first separator (included), and the separator id sorts after every
real id: what follows a separator never counts, so a position's place depends
only on its own document. That makes the order local: sorting shards of
whole documents apart and merging them (``kernels_merge``) gives exactly the
order of one sort over the whole stream, which the distributed build relies on.
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit

from retrieval_draft.store.layout import MAX_STREAM_TOKENS
from retrieval_draft_datastore.kernel_threads import on_threads

SMALL_RUN = 32  # runs up to this long are ordered by insertion
BYTE_RADIX_RUN = 128  # runs from this long by 8-bit radix passes, shorter ones by merge sort
RADIX_RUN = 1 << 14  # runs from this long by 16-bit radix passes (measured: ~3x faster than merge sort here)


@njit(cache=True, nogil=True)
def _window(words, p, width, w, bpt, sep):
    """(word, valid): tokens p .. p + width - 1 packed big-endian from the top of a word of ``w``
    tokens (zeros after a separator, which is included, and after ``width``) and the number
    of them before the first separator. ``words``: the stream as uint64 words (``_as_words``),
    read with two aligned loads and shifts instead of one load per token."""
    lanes = np.uint64(w)
    q = np.uint64(p) // lanes
    r = np.uint64(p) % lanes
    x = words[q]
    if r:
        x = (x >> (r * np.uint64(bpt))) | (words[q + np.uint64(1)] << ((lanes - r) * np.uint64(bpt)))
    if bpt == 16:  # little-endian lanes -> the first token in the top lane
        x = ((x & np.uint64(0x0000FFFF0000FFFF)) << np.uint64(16)) | ((x >> np.uint64(16)) & np.uint64(0x0000FFFF0000FFFF))
    x = (x << np.uint64(32)) | (x >> np.uint64(32))
    valid = width
    mask = np.uint64((1 << bpt) - 1)
    for k in range(width):
        if (x >> np.uint64(bpt * (w - 1 - k))) & mask == np.uint64(sep):
            valid = k
            break
    keep = min(valid + 1, width)
    if keep < w:
        x &= ~((np.uint64(1) << np.uint64(bpt * (w - keep))) - np.uint64(1))
    return x, valid


def _as_words(tokens: np.ndarray) -> np.ndarray:
    """The stream (n,) uint16/uint32 as little-endian uint64 words, padded with two zero words."""
    per_word = 8 // tokens.itemsize
    padded = np.zeros((tokens.size // per_word + 3) * per_word, tokens.dtype)
    padded[: tokens.size] = tokens
    return padded.view("<u8")


@njit(cache=True, nogil=True)
def _window_pair(words, p, offset, depth, w, bpt, sep):
    """(hi, lo, valid): the two words of the window of suffix ``p`` at ``offset`` (tokens
    offset .. offset + 2w, never past ``depth``) and its tokens before a separator."""
    w1 = min(w, depth - offset)
    w2 = min(w, depth - offset - w1)
    hi, v1 = _window(words, p + offset, w1, w, bpt, sep)
    lo, v2 = (np.uint64(0), 0)
    if v1 == w1 and w2 > 0:
        lo, v2 = _window(words, p + offset + w1, w2, w, bpt, sep)
    return hi, lo, v1 + v2


@njit(cache=True, nogil=True)
def _radix_order(keys, digit_bits):
    """Indices sorting uint64 ``keys`` (m,) stably: LSD radix over ``digit_bits``-bit digits
    (8 or 16), skipping digits every key shares (runs of one bucket share most of their
    leading ids). 16-bit digits pay a 65,536-entry count array per pass: for long runs only."""
    m = keys.size
    k = keys.copy()
    idx = np.arange(m)
    k_buf = np.empty_like(k)
    idx_buf = np.empty_like(idx)
    count = np.empty(1 << digit_bits, np.int64)
    mask = np.uint64((1 << digit_bits) - 1)
    for step in range(64 // digit_bits):
        shift = np.uint64(digit_bits * step)
        count[:] = 0
        for j in range(m):
            count[(k[j] >> shift) & mask] += 1
        if count.max() == m:
            continue
        total = 0
        for d in range(count.size):
            c = count[d]
            count[d] = total
            total += c
        for j in range(m):
            d = (k[j] >> shift) & mask
            q = count[d]
            k_buf[q] = k[j]
            idx_buf[q] = idx[j]
            count[d] = q + 1
        k, k_buf = k_buf, k
        idx, idx_buf = idx_buf, idx
    return idx


@njit(cache=True, nogil=True)
def _order_of(keys):
    """Indices sorting uint64 ``keys`` (m,) stably, by the method fastest at that length here."""
    if keys.size >= RADIX_RUN:
        return _radix_order(keys, np.int64(16))  # np.int64: a bare constant would compile its own copy
    if keys.size >= BYTE_RADIX_RUN:
        return _radix_order(keys, np.int64(8))
    return np.argsort(keys, kind="mergesort")


@njit(cache=True, nogil=True)
def _sort_segment(keys, a, b, pos, hi, lo, valid):
    """Stably sort the segment [a, b) of pos/hi/lo/valid by ``keys`` (which is hi or lo)."""
    done = True
    for i in range(a + 1, b):
        if keys[i] < keys[i - 1]:
            done = False
            break
    if done:
        return
    if b - a <= SMALL_RUN:  # insertion sort in place: no allocation for the many short runs
        for i in range(a + 1, b):
            p, h, l, v = pos[i], hi[i], lo[i], valid[i]
            k = keys[i]
            j = i - 1
            while j >= a and keys[j] > k:
                pos[j + 1], hi[j + 1], lo[j + 1], valid[j + 1] = pos[j], hi[j], lo[j], valid[j]
                j -= 1
            pos[j + 1], hi[j + 1], lo[j + 1], valid[j + 1] = p, h, l, v
        return
    order = _order_of(keys[a:b])
    p2, h2, l2, v2 = pos[a:b].copy(), hi[a:b].copy(), lo[a:b].copy(), valid[a:b].copy()
    for i in range(b - a):
        o = order[i]
        pos[a + i], hi[a + i], lo[a + i], valid[a + i] = p2[o], h2[o], l2[o], v2[o]


@njit(cache=True, nogil=True)
def _sort_by_hi(a, b, pos, hi, lo, valid):
    """Stably sort [a, b) by hi. A long segment is first split by the top 16 bits of hi in one
    counting pass that moves every array once (sequential reads), then each part is sorted."""
    m = b - a
    if m < RADIX_RUN:
        _sort_segment(hi, a, b, pos, hi, lo, valid)
        return
    count = np.zeros((1 << 16) + 1, np.int64)
    for i in range(a, b):
        count[(hi[i] >> np.uint64(48)) + np.uint64(1)] += 1
    for d in range(1 << 16):
        count[d + 1] += count[d]
    p2, h2, l2, v2 = pos[a:b].copy(), hi[a:b].copy(), lo[a:b].copy(), valid[a:b].copy()
    fill = count[:-1].copy()
    for i in range(m):
        d = h2[i] >> np.uint64(48)
        q = a + fill[d]
        fill[d] += 1
        pos[q], hi[q], lo[q], valid[q] = p2[i], h2[i], l2[i], v2[i]
    for d in range(1 << 16):
        if count[d + 1] - count[d] > 1:
            _sort_segment(hi, a + count[d], a + count[d + 1], pos, hi, lo, valid)


@njit(cache=True, nogil=True)
def _order_window(pos, hi, lo, valid, a, b, width, stack, offset):
    """Sort [a, b) (windows read at ``offset``, ``width`` tokens each) by hi, equal hi by lo;
    push (start, end, offset + width) for runs equal over a whole separator-free window."""
    _sort_by_hi(a, b, pos, hi, lo, valid)
    i = a
    while i < b:
        j = i + 1
        while j < b and hi[j] == hi[i]:
            j += 1
        if j - i > 1:
            _sort_segment(lo, i, j, pos, hi, lo, valid)
            k = i
            while k < j:
                e = k + 1
                while e < j and lo[e] == lo[k]:
                    e += 1
                if e - k > 1 and valid[k] == width:
                    stack.append((k, e, offset + width))
                k = e
        i = j


@njit(cache=True, nogil=True)
def _deeper_windows(words, pos, stack, depth, w, bpt, sep):
    """Finish the runs on ``stack`` ((start, end, offset), positions sharing ``offset`` tokens)
    window by window, until ``depth`` tokens are compared."""
    m = pos.size
    hi = np.empty(m, np.uint64)
    lo = np.empty(m, np.uint64)
    valid = np.empty(m, np.uint8)
    while len(stack):
        a, b, offset = stack.pop()
        if offset >= depth:
            continue
        for i in range(a, b):
            hi[i], lo[i], valid[i] = _window_pair(words, np.int64(pos[i]), offset, depth, w, bpt, sep)
        _order_window(pos, hi, lo, valid, a, b, min(2 * w, depth - offset), stack, offset)


@njit(cache=True, nogil=True)
def _prefix_stats(hi, lo, valid, w, bpt, lcp, svl):
    """lcp/svl (m,) of a sorted bucket from its first windows (offset 1, (m,) each), capped at 1 + 2w."""
    mask = np.uint64((1 << bpt) - 1)
    for i in range(hi.size):
        svl[i] = 1 + valid[i]
        if i == 0:
            lcp[i] = 0
            continue
        limit = min(valid[i], valid[i - 1])
        k = 0
        while k < limit:
            word_i = hi[i] if k < w else lo[i]
            word_j = hi[i - 1] if k < w else lo[i - 1]
            shift = np.uint64(bpt * (w - 1 - (k % w)))
            if (word_i >> shift) & mask != (word_j >> shift) & mask:
                break
            k += 1
        lcp[i] = 1 + k


@njit(cache=True, nogil=True)
def _sort_windows(q0, q1, words, sa, bounds, plan, depth, w, bpt, sep, lcp, svl, deep):
    """Steps 2 (and with ``deep``, 3 by windows) for the planned buckets plan[q0:q1] of ``sa``,
    in place (one thread's slice). Fills lcp/svl (capped at 1 + 2w)."""
    for q in range(q0, q1):
        a, b = bounds[plan[q]], bounds[plan[q] + 1]
        pos = sa[a:b]
        hi = np.empty(b - a, np.uint64)
        lo = np.empty(b - a, np.uint64)
        valid = np.empty(b - a, np.uint8)
        for i in range(b - a):
            hi[i], lo[i], valid[i] = _window_pair(words, np.int64(pos[i]), np.int64(1), depth, w, bpt, sep)
        stack = [(0, 0, 0)]
        stack.pop()
        # np.int64 constants: Numba compiles a callee once more for each literal argument (12 s here)
        _order_window(pos, hi, lo, valid, np.int64(0), b - a, min(2 * w, depth - 1), stack, np.int64(1))
        _prefix_stats(hi, lo, valid, w, bpt, lcp[a:b], svl[a:b])
        if deep:
            _deeper_windows(words, pos, stack, depth, w, bpt, sep)


@njit(cache=True, nogil=True)
def _group_ranks(q0, q1, sa, bounds, plan, lcp, svl, r, rank):
    """rank[sa[j]] = 1 + first row of j's group at depth ``r`` (rows whose first r tokens,
    up to a separator, are equal), for the planned buckets plan[q0:q1]."""
    for q in range(q0, q1):
        a, b = bounds[plan[q]], bounds[plan[q] + 1]
        start = a
        for j in range(a, b):
            same = j > a and (lcp[j] >= r or (svl[j] == svl[j - 1] and lcp[j] == svl[j]))
            if not same:
                start = j
            rank[sa[j]] = start + 1


@njit(cache=True, nogil=True)
def _rank_round(q0, q1, sa, bounds, plan, lcp, offset, rank):
    """Step 3 for the planned buckets plan[q0:q1]: stably sort every run of rows equal over
    their first ``offset`` tokens (lcp == offset) by rank[p + offset]."""
    for q in range(q0, q1):
        a, b = bounds[plan[q]], bounds[plan[q] + 1]
        j = a + 1
        while j < b:
            if lcp[j] < offset:
                j += 1
                continue
            s = j - 1
            e = j + 1
            while e < b and lcp[e] >= offset:
                e += 1
            keys = np.empty(e - s, np.uint64)
            for i in range(s, e):
                keys[i - s] = rank[np.int64(sa[i]) + offset]
            order = _order_of(keys)
            run = sa[s:e].copy()
            for i in range(e - s):
                sa[s + i] = run[order[i]]
            j = e


@njit(cache=True)
def _first_token_buckets(tokens, n_buckets, sep):
    """(sa (n,) uint32, bounds (n_buckets + 1,) int64): positions grouped by first token
    (separator last), ascending in each group."""
    n = tokens.size
    bounds = np.zeros(n_buckets + 1, np.int64)
    for i in range(n):
        t = tokens[i]
        bounds[(n_buckets - 1 if t == sep else np.int64(t)) + 1] += 1
    for c in range(n_buckets):
        bounds[c + 1] += bounds[c]
    fill = bounds[:-1].copy()
    sa = np.empty(n, np.uint32)
    for i in range(n):
        t = tokens[i]
        c = n_buckets - 1 if t == sep else np.int64(t)
        sa[fill[c]] = i
        fill[c] += 1
    return sa, bounds


def _thread_plans(sizes: np.ndarray, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Buckets (those of >= 2 positions, biggest first) dealt to the least loaded thread; (plan, starts)."""
    lists: list[list[int]] = [[] for _ in range(threads)]
    load = np.zeros(threads)
    for bucket in np.argsort(-sizes, kind="stable"):
        if sizes[bucket] < 1:
            break
        t = int(np.argmin(load))
        lists[t].append(int(bucket))
        load[t] += sizes[bucket] * np.log2(sizes[bucket] + 1.0)
    plan = np.array([b for part in lists for b in part], np.int64)
    return plan, np.cumsum([0] + [len(part) for part in lists]).astype(np.int64)


def sort_suffixes(tokens: np.ndarray, depth: int, sep: int, lcp_cap: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions of ``tokens`` (shape (n,), uint16/uint32, ending with ``sep``) sorted by their
    first ``depth`` tokens up to the first separator, then by position.

    Returns (sa (n,) uint32, lcp (n,) uint8, svl (n,) uint8): with ``lcp_cap`` > 0,
    ``lcp[j]`` is the separator-free common prefix of suffixes sa[j-1] and sa[j]
    and ``svl[j]`` the separator-free length of suffix sa[j], both capped at
    ``lcp_cap`` (what ``kernels_count`` scans); with 0 both are empty.
    Equal inputs give equal outputs.
    """
    n = int(tokens.size)
    if n > MAX_STREAM_TOKENS:
        raise ValueError(f"stream of {n} tokens exceeds the limit of {MAX_STREAM_TOKENS}")
    if n == 0 or int(tokens[-1]) != sep:
        raise ValueError("the stream must end with the separator")
    if depth < 2 or lcp_cap < 0:
        raise ValueError("need depth >= 2 and lcp_cap >= 0")
    bpt = 16 if tokens.dtype == np.uint16 else 32
    w = 64 // bpt
    window = 1 + 2 * w  # tokens ordered after step 2
    n_buckets = sep + 1 if bpt == 16 else int(tokens[tokens != sep].max(initial=0)) + 2
    sa, bounds = _first_token_buckets(tokens, n_buckets, sep)
    sizes = np.diff(bounds)
    sizes[-1] = 0  # the separator bucket: every key is the separator alone, so stream order stands
    plan, starts = _thread_plans(sizes, get_num_threads())
    lcp = np.zeros(n, np.uint8)
    svl = np.zeros(n, np.uint8)
    rest = depth - window
    by_rank = 0 < rest <= window
    on_threads(_sort_windows, starts, _as_words(tokens), sa, bounds, plan, depth, w, bpt, sep, lcp, svl, rest > window)
    if by_rank:
        rank = np.empty(n, np.uint32)
        rank[sa[bounds[-2] :]] = bounds[-2] + 1  # the separator bucket is one group
        on_threads(_group_ranks, starts, sa, bounds, plan, lcp, svl, rest, rank)
        on_threads(_rank_round, starts, sa, bounds, plan, lcp, window, rank)
        del rank
    if lcp_cap == 0:
        return sa, np.zeros(0, np.uint8), np.zeros(0, np.uint8)
    if lcp_cap <= min(window, depth):
        return sa, np.minimum(lcp, lcp_cap), np.minimum(svl, lcp_cap)
    from retrieval_draft_datastore.kernels_count import capped_lcp, valid_lengths

    vlen = valid_lengths(tokens, sep, lcp_cap)
    return sa, capped_lcp(tokens, sa, vlen, lcp_cap), vlen[sa]
