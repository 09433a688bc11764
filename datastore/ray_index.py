"""Stage 2 of the Ray build: sort shards, merge them by key range, count each range, as Ray tasks.

1. ``sort_shard`` (one task per shard of whole documents): the existing
   suffix sort (``kernels_sort``) over the shard, positions made global, then
   cut into P pieces by first token (the cuts balance P ranges of the
   stream's first-token histogram). This is the shuffle: piece p of every
   shard goes to range p.
2. ``index_range`` (one task per range p): merge the P-th pieces of all
   shards (``kernels_merge``), which gives exactly the rows of the global
   suffix array whose first token is in range p, then count its n-grams and
   trie keys with the existing kernels (``index.index_part``).

The stream itself is put in the object store once and read zero-copy by
every task on a node. A task holds one shard (sort, ~20 bytes/token) or one
range (merge and count, ~10 bytes per suffix-array row of the range), so
memory per worker is bounded by the shard size and by the largest range
(a single very frequent first token cannot be split). Ray retries a task
whose worker died (``max_retries``); every task is a pure function of its
inputs, so a retry gives the same result. Imports ``ray`` lazily.
"""

from __future__ import annotations

import sys

import numpy as np

from retrieval_draft_datastore.index import IndexParams, PartIndex, index_part
from retrieval_draft_datastore.kernels_count import capped_lcp, valid_lengths
from retrieval_draft_datastore.kernels_merge import first_token_bounds, merge_runs
from retrieval_draft_datastore.kernels_sort import sort_suffixes

TASK_RETRIES = 3


def range_cuts(tokens: np.ndarray, vocab_size: int, sep: int, ranges: int) -> np.ndarray:
    """First ids of ``ranges`` contiguous id ranges holding about equal numbers of stream positions.

    Shape (P,), int64, ascending, cuts[0] = 0 (P <= ranges: empty ranges are merged).
    The separator counts as id ``vocab_size`` and always falls in the last range.
    """
    ids = np.where(tokens == sep, vocab_size, tokens).astype(np.int64)
    cumulative = np.cumsum(np.bincount(ids, minlength=vocab_size + 1))
    targets = (np.arange(1, ranges) * tokens.size) // ranges
    cuts = np.searchsorted(cumulative, targets, side="right")
    return np.unique(np.concatenate([[0], np.minimum(cuts, vocab_size - 1)])).astype(np.int64)


def sort_shard(tokens: np.ndarray, start: int, end: int, depth: int, sep: int, cuts: np.ndarray) -> list[np.ndarray]:
    """Global positions start..end-1 sorted (``sort_suffixes`` on the shard), cut into len(cuts) pieces."""
    local, _, _ = sort_suffixes(tokens[start:end], depth, sep)
    positions = (local.astype(np.int64) + start).astype(np.uint32)
    bounds = list(first_token_bounds(tokens, positions, cuts)) + [positions.size]
    return [positions[bounds[p] : bounds[p + 1]] for p in range(len(cuts))]


def index_range(tokens: np.ndarray, vlen: np.ndarray, depth: int, sep: int, params: IndexParams,
                *pieces: np.ndarray) -> tuple[np.ndarray, PartIndex]:
    """(suffix-array rows of one first-token range, merged from every shard's piece; their counts).
    ``vlen = valid_lengths(tokens, sep, params.lcp_cap)``."""
    rows = merge_runs(tokens, list(pieces), depth, sep)
    return rows, index_part(tokens, rows, capped_lcp(tokens, rows, vlen, params.lcp_cap), vlen[rows], params)


def index_on_ray(tokens: np.ndarray, shard_sizes: list[int], vocab_size: int, sep: int, params: IndexParams,
                 ranges: int, progress: bool = True) -> tuple[np.ndarray, list[PartIndex], list[int]]:
    """The suffix array of ``tokens`` and its counted parts (in key order) with their sizes.

    ``shard_sizes``: tokens per shard (whole documents each, summing to the stream length).
    """
    import ray

    sort_task = ray.remote(num_returns=1, max_retries=TASK_RETRIES)(sort_shard)
    range_task = ray.remote(num_returns=2, max_retries=TASK_RETRIES)(index_range)
    cuts = range_cuts(tokens, vocab_size, sep, ranges)
    tokens_ref = ray.put(tokens)
    vlen_ref = ray.put(valid_lengths(tokens, sep, params.lcp_cap))
    offsets = np.concatenate([[0], np.cumsum(shard_sizes)]).astype(np.int64)
    pieces = []
    for s in range(len(shard_sizes)):
        refs = sort_task.options(num_returns=len(cuts)).remote(
            tokens_ref, int(offsets[s]), int(offsets[s + 1]), params.sort_depth, sep, cuts)
        pieces.append(refs if len(cuts) > 1 else [refs])
    results = [range_task.remote(tokens_ref, vlen_ref, params.sort_depth, sep, params, *(p[r] for p in pieces))
               for r in range(len(cuts))]
    _wait_all([pair[0] for pair in results], "indexing ranges", progress)
    rows = [ray.get(pair[0]) for pair in results]
    parts = [ray.get(pair[1]) for pair in results]
    return np.concatenate(rows), parts, [int(r.size) for r in rows]


def _wait_all(refs: list, label: str, progress: bool) -> None:
    """Block until every ref is ready, with a tqdm bar on stderr; raises the first task error."""
    import ray
    from tqdm import tqdm

    pending = list(refs)
    with tqdm(total=len(refs), desc=label, unit="range", file=sys.stderr, disable=not progress) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
            bar.update(len(done))
