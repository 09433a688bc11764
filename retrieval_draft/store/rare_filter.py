"""The rare-context filters of a sharded store: per shard, a Bloom filter over the contexts that
draft (at least ``min_count`` continuations in the whole corpus) but are too rare for the n-gram
table (fewer than ``table_min_total``) and have a row in that shard, so that a table miss is
searched only in the shards that may hold it.

A shard whose filter rules a context out holds no row of it (a Bloom filter has no false
negatives), or the context does not draft at all, so skipping that shard's search changes no
count that decides a draft; the shards it lets through (those holding the context, and about 1% of
the others) are searched as before. Without the filters a context missing from the table costs one
binary search per shard per order tried.

Layout: ``words`` (W,) uint64 in blocks of 8 words (512 bits, one cache line); a context of hash
h (``context_hash``) sets ``HASHES`` bits in block h mod (W / 8), at the offsets given by 9-bit
fields of a second mix of h, so a lookup reads one cache line per shard. An empty array means
"no filter" (flat stores): every miss is counted.
"""

from __future__ import annotations

import numpy as np
from numba import njit

BITS_PER_CONTEXT = 10  # with HASHES = 7 in 512-bit blocks: about 1-2% of ruled-out contexts pass
HASHES = 7
BLOCK_WORDS = 8


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


@njit(cache=True, inline="always")
def _block_and_bits(words, h) -> tuple:
    """(first word of the context's 512-bit block, the HASHES bit offsets within it as one
    uint64 holding 9 bits per offset)."""
    blocks = np.uint64(words.size // BLOCK_WORDS)
    return np.int64((h % blocks) * np.uint64(BLOCK_WORDS)), _mix(h)


@njit(cache=True)
def may_contain(words, h) -> bool:
    """Whether the filter ``words`` may hold the context of hash ``h`` (uint64; from Python pass
    ``np.uint64(context_hash(...))``); True for an empty filter. Reads one cache line."""
    if words.size == 0:
        return True
    h = np.uint64(h)  # a Python int arrives as int64, and int64 + uint64 would be float64
    start, bits = _block_and_bits(words, h)
    for i in range(HASHES):
        bit = (bits >> np.uint64(9 * i)) & np.uint64(511)
        if not (words[start + np.int64(bit >> np.uint64(6))] >> (bit & np.uint64(63))) & np.uint64(1):
            return False
    return True


@njit(cache=True)
def _set_bits(words, hashes) -> None:
    for h in hashes:
        start, bits = _block_and_bits(words, h)
        for i in range(HASHES):
            bit = (bits >> np.uint64(9 * i)) & np.uint64(511)
            words[start + np.int64(bit >> np.uint64(6))] |= np.uint64(1) << (bit & np.uint64(63))


def build_filter(hashes: np.ndarray) -> np.ndarray:
    """The filter words for contexts of ``hashes`` (K,) uint64: about BITS_PER_CONTEXT bits each,
    in whole 512-bit blocks (at least one)."""
    blocks = max(1, (hashes.size * BITS_PER_CONTEXT + 511) // 512)
    words = np.zeros(blocks * BLOCK_WORDS, np.uint64)
    _set_bits(words, hashes)
    return words
