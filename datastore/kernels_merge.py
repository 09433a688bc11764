"""Numba kernels that combine suffix arrays sorted shard by shard into one order.

Every shard is a run of whole documents, so it ends with a separator, and
the sort key of a position stops at its first separator
(``kernels_sort``): a shard's sorted positions are already in the order the
whole stream would give them. Combining shards is therefore a merge: two
positions compare by their first ``depth`` tokens up to a separator, then
by position. ``first_token_bounds`` cuts a sorted run at first-token
boundaries, so one key range of every shard can be merged on its own.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _before(tokens: np.ndarray, a: int, b: int, depth: int, sep: int) -> bool:
    """Whether position ``a`` sorts before ``b`` (first ``depth`` tokens up to a separator, then position)."""
    for k in range(depth):
        ta = tokens[a + k]
        tb = tokens[b + k]
        if ta != tb:
            return ta < tb
        if ta == sep:
            break
    return a < b


@njit(cache=True)
def merge_two(tokens: np.ndarray, left: np.ndarray, right: np.ndarray, depth: int, sep: int) -> np.ndarray:
    """Merge two sorted position arrays (uint32) into one sorted array of both; (len(left)+len(right),)."""
    out = np.empty(left.size + right.size, np.uint32)
    i = j = k = 0
    while i < left.size and j < right.size:
        if _before(tokens, np.int64(right[j]), np.int64(left[i]), depth, sep):
            out[k] = right[j]
            j += 1
        else:
            out[k] = left[i]
            i += 1
        k += 1
    while i < left.size:
        out[k] = left[i]
        i += 1
        k += 1
    while j < right.size:
        out[k] = right[j]
        j += 1
        k += 1
    return out


def merge_runs(tokens: np.ndarray, runs: list[np.ndarray], depth: int, sep: int) -> np.ndarray:
    """One sorted array of every position in ``runs`` (each sorted; uint32), by pairwise merges."""
    runs = [np.asarray(r, np.uint32) for r in runs] or [np.zeros(0, np.uint32)]
    while len(runs) > 1:
        merged = [merge_two(tokens, runs[i], runs[i + 1], depth, sep) for i in range(0, len(runs) - 1, 2)]
        runs = merged + ([runs[-1]] if len(runs) % 2 else [])
    return runs[0]


def first_token_bounds(tokens: np.ndarray, run: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """Indices into the sorted ``run`` where the first token reaches each of ``cuts`` (ascending ids).

    ``run[b[p]:b[p+1]]`` holds the positions whose first token is in
    ``[cuts[p], cuts[p+1])``; shape (len(cuts),), int64.
    """
    return np.searchsorted(tokens[run], cuts.astype(tokens.dtype), side="left").astype(np.int64)
