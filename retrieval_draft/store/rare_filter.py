"""The rare-context filter of a sharded store: a Bloom filter over every context that drafts
(at least ``min_count`` continuations) but is too rare for the n-gram table (fewer than
``table_min_total``), so that most table misses need no suffix-array search in any shard.

A table miss whose context the filter rules out has fewer than ``min_count`` continuations in
the whole corpus (a Bloom filter has no false negatives), exactly what counting it from every
shard would have found; one it lets through (the rare contexts, and about 1% of the others) is
counted from the shards as before. So drafts never change, only the work: without it a novel
context costs one binary search per shard per order tried.

Layout: ``words`` (W,) uint64, bit b at words[b >> 6] bit (b & 63), W * 64 bits; each context
sets ``HASHES`` bits at (h1 + i * h2) mod (W * 64) for i < HASHES, h1/h2 from ``context_hash``.
An empty array means "no filter" (flat stores): every miss is counted.
"""

from __future__ import annotations

import numpy as np
from numba import njit

BITS_PER_CONTEXT = 10  # with HASHES = 7: about 1% of ruled-out contexts pass
HASHES = 7


@njit(cache=True, inline="always")
def _mix(x):
    """splitmix64's finaliser on a uint64."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def context_hash(ctx) -> np.uint64:
    """64-bit hash of a context (n,) of ids (its order included)."""
    h = _mix(np.uint64(0x9E3779B97F4A7C15) + np.uint64(ctx.size))
    for k in range(ctx.size):
        h = _mix(h ^ np.uint64(ctx[k]))
    return h


@njit(cache=True)
def may_contain(words, h) -> bool:
    """Whether the filter ``words`` may hold the context of hash ``h`` (uint64; from Python pass
    ``np.uint64(context_hash(...))``) (True for an empty filter)."""
    if words.size == 0:
        return True
    h = np.uint64(h)  # a Python int arrives as int64, and int64 + uint64 would be float64
    size = np.uint64(words.size * 64)
    step = _mix(h) | np.uint64(1)
    for i in range(HASHES):
        bit = (h + np.uint64(i) * step) % size
        if not (words[bit >> np.uint64(6)] >> (bit & np.uint64(63))) & np.uint64(1):
            return False
    return True


@njit(cache=True)
def row_hashes(ctx, n) -> np.ndarray:
    """Hashes of the first ``n`` ids of every row of ``ctx`` (R, >= n); (R,) uint64."""
    out = np.empty(ctx.shape[0], np.uint64)
    buf = np.empty(n, np.int64)
    for r in range(ctx.shape[0]):
        for k in range(n):
            buf[k] = ctx[r, k]
        out[r] = context_hash(buf)
    return out


@njit(cache=True)
def _set_bits(words, hashes) -> None:
    size = np.uint64(words.size * 64)
    for h in hashes:
        step = _mix(h) | np.uint64(1)
        for i in range(HASHES):
            bit = (h + np.uint64(i) * step) % size
            words[bit >> np.uint64(6)] |= np.uint64(1) << (bit & np.uint64(63))


def build_filter(hashes: np.ndarray) -> np.ndarray:
    """The filter words for contexts of ``hashes`` (K,) uint64: BITS_PER_CONTEXT bits each, at least
    one word."""
    words = np.zeros(max(1, (hashes.size * BITS_PER_CONTEXT + 63) // 64), np.uint64)
    _set_bits(words, hashes)
    return words
