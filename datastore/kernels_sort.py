"""Numba kernel: sort every stream position by the tokens that start there.

Prefix doubling with LSD radix sorts. First the positions are sorted by a
64-bit key packing their first ``k0`` tokens (4 uint16 or 2 uint32 ids);
then each round sorts by the pair ``(rank_h[i], rank_h[i + h])`` which
doubles the sorted prefix length ``h``. Keys are built by a *sequential*
pass over positions and sorted with 11-bit LSD radix passes, whose scatters
stay cache friendly; only the rank update is a random scatter. Rounds stop
once ``h >= depth`` or every position is alone in its group, giving a
suffix array sorted to ``effective_depth`` tokens; ties keep position order.

The key of a position stops at the first separator (included): what follows
a separator never counts, so a position's place depends only on its own
document. That makes the order local: sorting shards of whole documents
apart and merging them (``kernels_merge``) gives exactly the order of one
sort over the whole stream, which the distributed build relies on. Two
positions whose keys are equal (the same tokens up to a separator, or the
same first ``effective_depth`` tokens) keep their stream order.

Ranks are "start of the equal-prefix group + 1"; 0 means "nothing more"
(past a separator or past the end).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from retrieval_draft.store.layout import MAX_STREAM_TOKENS
from retrieval_draft_datastore.kernels_count import valid_lengths

RADIX_BITS = 11


@njit(cache=True)
def _radix_sort(keys: np.ndarray, idx: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Stable LSD radix sort of uint64 ``keys`` (low ``bits`` bits) carrying int32 ``idx``."""
    n = keys.size
    key_buf = np.empty_like(keys)
    idx_buf = np.empty_like(idx)
    n_buckets = 1 << RADIX_BITS
    mask = np.uint64(n_buckets - 1)
    shift = 0
    while shift < bits:
        sh = np.uint64(shift)
        count = np.zeros(n_buckets, np.int64)
        for j in range(n):
            count[(keys[j] >> sh) & mask] += 1
        shift += RADIX_BITS
        if count.max() == n:  # every key has the same digit: nothing moves
            continue
        total = 0
        for b in range(n_buckets):
            c = count[b]
            count[b] = total
            total += c
        for j in range(n):
            d = (keys[j] >> sh) & mask
            q = count[d]
            key_buf[q] = keys[j]
            idx_buf[q] = idx[j]
            count[d] = q + 1
        keys, key_buf = key_buf, keys
        idx, idx_buf = idx_buf, idx
    return keys, idx


@njit(parallel=True, cache=True)
def _initial_keys(tokens: np.ndarray, k0: int, bits_per_token: int, sep: int) -> np.ndarray:
    """Key of position i: tokens[i:i+k0] packed big-endian, 0 after a separator or the end; (n,), uint64."""
    n = tokens.size
    keys = np.zeros(n, np.uint64)
    for i in prange(n):
        key = np.uint64(0)
        ended = False
        for k in range(k0):
            t = np.uint64(0)
            if not ended and i + k < n:
                t = np.uint64(tokens[i + k])
                ended = tokens[i + k] == sep
            key = (key << np.uint64(bits_per_token)) | t
        keys[i] = key
    return keys


@njit(parallel=True, cache=True)
def _pair_keys(rank: np.ndarray, h: int, bits: int, vlen: np.ndarray) -> np.ndarray:
    """Key of position i: (rank[i] << bits) | rank[i + h], the second 0 when a separator
    lies in tokens[i:i+h] (``vlen[i] < h``) or past the end; (n,), uint64."""
    n = rank.size
    keys = np.empty(n, np.uint64)
    for i in prange(n):
        second = rank[i + h] if i + h < n and vlen[i] >= h else 0
        keys[i] = (np.uint64(rank[i]) << np.uint64(bits)) | np.uint64(second)
    return keys


@njit(cache=True)
def _group_ranks(sorted_keys: np.ndarray, sa: np.ndarray, rank: np.ndarray) -> int:
    """Write rank[sa[j]] = start of j's equal-key group + 1; returns the number of groups."""
    start = 0
    groups = 0
    for j in range(sa.size):
        if j == 0 or sorted_keys[j] != sorted_keys[j - 1]:
            start = j
            groups += 1
        rank[sa[j]] = start + 1
    return groups


def effective_depth(depth: int, dtype: np.dtype) -> int:
    """Tokens the sort really orders by: the first power-of-two multiple of the initial
    key width (4 uint16 or 2 uint32 ids) that reaches ``depth``."""
    h = 64 // (16 if np.dtype(dtype) == np.uint16 else 32)
    while h < depth:
        h *= 2
    return h


def sort_suffixes(tokens: np.ndarray, depth: int, sep: int) -> np.ndarray:
    """Positions of ``tokens`` (shape (n,), uint16/uint32, ending with ``sep``) sorted by
    their first ``effective_depth(depth)`` tokens up to the first separator, then by position.

    Returns shape (n,), uint32. Equal inputs give equal outputs.
    """
    n = int(tokens.size)
    if n > MAX_STREAM_TOKENS:
        raise ValueError(f"stream of {n} tokens exceeds the limit of {MAX_STREAM_TOKENS}")
    bits_per_token = 16 if tokens.dtype == np.uint16 else 32
    k0 = 64 // bits_per_token
    keys = _initial_keys(tokens, k0, bits_per_token, sep)
    keys, sa = _radix_sort(keys, np.arange(n, dtype=np.int32), 64)
    rank = np.empty(n, np.int32)
    groups = _group_ranks(keys, sa, rank)
    rank_bits = max(1, int(n + 1).bit_length())
    final = effective_depth(depth, tokens.dtype)
    vlen = valid_lengths(tokens, sep, min(final, 255)) if final > k0 else np.zeros(0, np.uint8)
    h = k0
    while h < final and groups < n:
        keys, sa = _radix_sort(_pair_keys(rank, h, rank_bits, vlen), np.arange(n, dtype=np.int32), 2 * rank_bits)
        groups = _group_ranks(keys, sa, rank)
        h *= 2
    return sa.astype(np.uint32)
