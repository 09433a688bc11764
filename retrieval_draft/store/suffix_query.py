"""Numba kernels behind the suffix drafter: longest match over every shard, then continuations.

A store comes as the ``shard_arrays`` tuple (a flat store is one shard). The
longest match is the longest suffix of the query that occurs in any shard;
its occurrences are the union of each shard's suffix-array range for it.

Sampling rule (``suffix_drafts``): with N occurrences in all and s = min(N,
samples), occurrence number (k * N) // s for k < s is read, counting through
the shards' ranges laid end to end in stream order. With one shard this is the
flat store's stratified sample, row for row. Across shards it reads the same
occurrences as one index over the same documents whenever N <= samples (every
occurrence is read) or all occurrences share their sorted key (a match of the
full sort depth: one index orders them by position, i.e. shard by shard);
otherwise it is a stratified sample of the same occurrences in another order.
An exact global rank would need about S binary searches per sample (a k-way
selection), more than the whole propose costs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from retrieval_draft.store.packed import position_at
from retrieval_draft.store.query import narrow_range


@njit(cache=True)
def _shard_match(store, i, query, m) -> tuple:
    """Range (lo, hi) of shard ``i``'s suffix array whose suffixes start with query[-m:]."""
    tokens_l, words_l, bits_l, first_lo, first_hi, sep, vocab_size = store
    q = query[query.size - m :]
    return narrow_range(tokens_l[i], words_l[i], bits_l[i], np.int64(first_lo[i][q[0]]),
                        np.int64(first_hi[i][q[0]]), q)


@njit(cache=True)
def _search_up(store, i, query, low, lo, hi) -> int:
    """Binary search over m in [low, query.size] for the longest match in shard ``i`` (a match of
    low - 1 is known); the range of the longest found goes into lo[i], hi[i]. Returns it (low - 1
    when none is longer)."""
    best, high = low - 1, query.size
    while low <= high:
        m = (low + high) // 2
        a, b = _shard_match(store, i, query, m)
        if b > a:
            best, lo[i], hi[i] = m, a, b
            low = m + 1
        else:
            high = m - 1
    return best


@njit(cache=True)
def longest_match(store, query, lo, hi) -> int:
    """Longest m such that query[-m:] occurs in some shard (0: none); shard i's range of it into
    lo[i], hi[i] ((S,) int64; empty where it does not occur). ``query``: ids < vocab, int64.

    Shard 0 is binary-searched over m (matching is monotone: a suffix of a match matches). Every
    later shard is probed at the best m so far: no match there means none longer (one probe);
    a match gives its range, and a second probe at best + 1 says whether to search further up.
    When a shard raises the best, the earlier shards' ranges are emptied: none of them matched
    the new best (each one's own longest was at most the old best).
    """
    lo[:] = 0
    hi[:] = 0
    one = np.int64(1)  # np.int64 constants: Numba compiles a callee once more per literal argument
    best = _search_up(store, np.int64(0), query, one, lo, hi)
    for i in range(1, len(store[0])):
        if best == 0:
            best = _search_up(store, i, query, one, lo, hi)
            continue
        a, b = _shard_match(store, i, query, best)
        if b <= a:
            continue
        lo[i], hi[i] = a, b
        longer = _search_up(store, i, query, best + 1, lo, hi) if best < query.size else best
        if longer > best:
            best = longer
            lo[:i] = 0
            hi[:i] = 0
    return best


@njit(cache=True)
def _read_samples(store, lo, hi, m, s, max_len, cont, clen) -> None:
    """Continuations (after the match of length ``m``) of ``s`` occurrences spread evenly over the
    shards' ranges lo[i]:hi[i] laid end to end, each cut at a separator: into cont (s, max_len), clen (s,)."""
    tokens_l, words_l, bits_l = store[0], store[1], store[2]
    sep = store[5]
    total = 0
    for i in range(lo.size):
        total += hi[i] - lo[i]
    i = 0
    before = 0  # occurrences in shards before i
    for k in range(s):
        g = (k * total) // s
        while g >= before + hi[i] - lo[i]:
            before += hi[i] - lo[i]
            i += 1
        tokens = tokens_l[i]
        p = position_at(words_l[i], bits_l[i], lo[i] + g - before) + m
        L = 0
        while L < max_len and p + L < tokens.size and tokens[p + L] != sep:
            cont[k, L] = tokens[p + L]
            L += 1
        clen[k] = L


@njit(cache=True)
def suffix_drafts(store, lo, hi, m, samples, branches, pseudo, out_tok, out_prob, out_len) -> int:
    """Frequency-weighted continuations of a match of length ``m`` whose occurrences are shard i's
    rows lo[i]:hi[i] (the sampling rule: module docstring).

    Stops each sampled continuation at a separator, then for each of the ``branches`` most frequent
    first tokens follows the majority token among the still-agreeing occurrences. Step
    probability = occurrences continuing that way / occurrences before the step, plus ``pseudo``
    (unseen occurrences that shrink thin evidence). Ties go to the smaller id, so results are
    deterministic and depend only on which occurrences were read.
    """
    max_len = out_tok.shape[1]
    span = 0
    for i in range(lo.size):
        span += hi[i] - lo[i]
    s = min(span, samples)
    cont = np.empty((s, max_len), np.int64)
    clen = np.zeros(s, np.int64)
    _read_samples(store, lo, hi, m, s, max_len, cont, clen)
    active = np.zeros(s, np.bool_)
    used = np.zeros(s, np.bool_)  # rows whose first token was already a branch
    n = 0
    while n < min(branches, out_tok.shape[0]):
        first, count = _majority(cont, clen, ~used, np.int64(0))  # not a literal: one compiled copy
        if count == 0:
            break
        for k in range(s):
            active[k] = (not used[k]) and clen[k] > 0 and cont[k, 0] == first
            used[k] = used[k] or active[k]
        out_tok[n, 0] = first
        out_prob[n, 0] = count / (s + pseudo)
        depth = np.int64(1)
        while depth < max_len:
            tok, c = _majority(cont, clen, active, depth)
            if c == 0:
                break
            live = 0
            for k in range(s):
                if active[k]:
                    live += 1
                    active[k] = clen[k] > depth and cont[k, depth] == tok
            out_tok[n, depth] = tok
            out_prob[n, depth] = c / (live + pseudo)
            depth += 1
        out_len[n] = depth
        n += 1
    return n


@njit(cache=True)
def _majority(cont, clen, mask, depth) -> tuple:
    """Most frequent id at ``depth`` among masked rows long enough (ties: smaller id); (id, count)."""
    ids = np.empty(cont.shape[0], np.int64)
    n = 0
    for k in range(cont.shape[0]):
        if mask[k] and clen[k] > depth:
            ids[n] = cont[k, depth]
            n += 1
    if n == 0:
        return -1, 0
    ids = np.sort(ids[:n])
    best, best_count = ids[0], 0
    run = 0
    for k in range(n):
        run = run + 1 if k > 0 and ids[k] == ids[k - 1] else 1
        if run > best_count:
            best, best_count = ids[k], run
    return best, best_count
