"""Index a token stream: suffix array, Markov n-gram table, suffix trie, as files.

Input is the whole stream (shape (T,), uint16/uint32, separator-terminated
documents); output is the data files of ``retrieval_draft.store.layout`` written into a
directory. Memory peaks at about 30 bytes per token of the biggest first-token
bucket during the sort, plus 10 bytes per token for the stream, suffix array,
rank and per-row arrays.

The work after the sort splits by key range of the suffix array
(``index_part``): a context of n >= 1 tokens is one contiguous group that
never straddles a first-token boundary, so each range of first tokens is
counted on its own and the parts are concatenated in key order
(``write_parts``). The single-process build is the one-part case
(``write_index``); the distributed build counts many parts on many workers.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from retrieval_draft.errors import InvalidInputError
from retrieval_draft.store.arrow_io import write_table
from retrieval_draft.store.layout import MAX_STORED_TOTAL, NGRAM, SUFFIX_ARRAY, SUFFIX_RANGES, TOKENS, TRIE, count_dtype
from retrieval_draft.store.packed import pack_positions, position_bits
from retrieval_draft.store.suffix_trie import build_trie, encode_rows, key_width
from retrieval_draft_datastore.kernels_count import count_ngrams, trie_ranges
from retrieval_draft_datastore.kernels_sort import sort_suffixes


MAX_ORDER = 15  # longest n-gram context: the table holds a row per context of every order up to it
MAX_TOP_K = 64  # next tokens kept per context (the n-gram drafter branches at most a few ways)
MAX_DEPTH = 255  # sort and trie depth: common-prefix lengths are counted in uint8
MAX_COUNT = 2**32 - 1  # count thresholds: counts and totals are at most uint32


@dataclass(frozen=True)
class IndexParams:
    """Build parameters (stored in the manifest). Every accepted value gives a store that drafts;
    anything else is an InvalidInputError naming the command-line flag and its range.

    Attributes:
        max_order: longest Markov context, in tokens (1..15).
        top_k: next tokens kept per context (1..64).
        min_count: contexts with fewer continuations never draft (1..2**32 - 1).
        sort_depth: tokens the suffix array is sorted by = longest suffix match (max_order + 1..255).
        trie_depth: longest n-gram keyed in the suffix trie (1..sort_depth).
        trie_min_count: n-grams of order >= 2 enter the trie from this many occurrences (1..2**32 - 1).
        table_min_total: contexts with at least this many continuations are stored in the
            n-gram table; rarer ones are counted from the suffix array when drafting (at most
            this many rows read), which keeps the table small (1..2**32 - 1).
    """

    max_order: int = 4
    top_k: int = 4
    min_count: int = 2
    sort_depth: int = 16
    trie_depth: int = 2
    trie_min_count: int = 64
    table_min_total: int = 64

    def __post_init__(self) -> None:
        _in_range("--max-order", self.max_order, 1, MAX_ORDER)
        _in_range("--sort-depth", self.sort_depth, self.max_order + 1, MAX_DEPTH, "above --max-order")
        _in_range("--trie-depth", self.trie_depth, 1, self.sort_depth, "at most --sort-depth")
        _in_range("--top-k", self.top_k, 1, MAX_TOP_K)
        _in_range("--min-count", self.min_count, 1, MAX_COUNT)
        _in_range("trie_min_count", self.trie_min_count, 1, MAX_COUNT)  # no flag: the library's alone
        _in_range("--table-min-total", self.table_min_total, 1, MAX_COUNT)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def lcp_cap(self) -> int:
        """Longest common prefix the counting needs, in tokens."""
        return max(self.max_order + 1, self.trie_depth)


def _in_range(label: str, value, lo: int, hi: int, why: str = "") -> None:
    """InvalidInputError unless ``value`` is an int in lo..hi; ``label`` names it (the command-line flag)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        reason = f" ({why})" if why else ""
        raise InvalidInputError(f"{label} must be an integer in {lo}..{hi}{reason}, got {value!r}")


@dataclass(frozen=True)
class PartIndex:
    """Counts of one key range of the suffix array.

    Attributes:
        per_order: per order n = 1..max_order, (ctx (R, n), nxt (R, K), cnt (R, K) uint32, tot (R,) uint32).
        lo, hi: (R,) uint32 trie-key ranges, relative to the part's first suffix-array row.
        dep: (R,) uint8 trie-key lengths.
    """

    per_order: list
    lo: np.ndarray
    hi: np.ndarray
    dep: np.ndarray


def index_part(tokens: np.ndarray, sa_part: np.ndarray, lcp: np.ndarray, svl: np.ndarray, params: IndexParams,
               threads: int = 1) -> PartIndex:
    """Count the table's n-grams and the trie keys of ``sa_part``, a run of the suffix array
    holding whole first-token groups, with its per-row ``lcp``/``svl`` capped at
    ``params.lcp_cap`` (see ``kernels_count``).

    ``threads``: the orders and the trie ranges are independent scans (Numba, GIL released),
    run on this many threads.
    """
    table_min = max(params.min_count, params.table_min_total)
    jobs = [lambda n=n: count_ngrams(tokens, sa_part, lcp, svl, n, params.top_k, table_min)
            for n in range(params.max_order, 0, -1)]  # longest first: the slowest scans start first
    jobs.append(lambda: trie_ranges(lcp, svl, params.trie_depth, params.trie_min_count))
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        results = list(pool.map(lambda job: job(), jobs))
    lo, hi, dep = results[-1]
    return PartIndex(results[-2::-1], lo, hi, dep)


def _ngram_columns(per_order: list[tuple], max_order: int, dtype: np.dtype) -> dict[str, np.ndarray]:
    """Stack the per-order tables into the columns of ngram.arrow (contexts zero-padded to max_order;
    counts and totals uint16, see ``narrow_counts``)."""
    order = np.concatenate([np.full(len(t[3]), n, np.uint8) for n, t in enumerate(per_order, 1)])
    ctx = np.zeros((order.size, max_order), dtype)
    row = 0
    for n, (c, _, _, _) in enumerate(per_order, 1):
        ctx[row : row + len(c), :n] = c
        row += len(c)
    count, total = narrow_counts(np.concatenate([t[2] for t in per_order]), np.concatenate([t[3] for t in per_order]))
    return {"order": order, "context": ctx, "next": np.concatenate([t[1] for t in per_order]),
            "count": count, "total": total}


def narrow_counts(count: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts (R, K) and totals (R,) as uint16.

    A row whose total exceeds 65,535 (a few hundred contexts such as a newline
    in a big corpus) is scaled to a total of 65,535, counts rounded: every
    draft probability count / (total + pseudo) moves by at most
    (pseudo + 0.5) / 65,536 (2.3e-5 at the drafters' pseudo = 1), the slot
    order stays, and continuations rarer than 1 in 131,070 drop out (count 0
    = unused slot). Rows within 16 bits are stored exactly.
    """
    limit = MAX_STORED_TOTAL
    big = total > limit
    count = count.astype(np.float64 if big.any() else count.dtype)
    if big.any():
        count[big] = np.floor(count[big] * (limit / total[big].astype(np.float64))[:, None] + 0.5)
    return count.astype(count_dtype(limit)), np.minimum(total, limit).astype(count_dtype(limit))


def _concat_parts(parts: list[PartIndex], sizes: list[int], max_order: int) -> tuple:
    """(per-order tables, lo, hi, dep) of the whole suffix array from its parts in key order."""
    per_order = [tuple(np.concatenate([p.per_order[n][f] for p in parts]) for f in range(4))
                 for n in range(max_order)]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    lo = np.concatenate([p.lo.astype(np.int64) + s for p, s in zip(parts, starts)]).astype(np.uint32)
    hi = np.concatenate([p.hi.astype(np.int64) + s for p, s in zip(parts, starts)]).astype(np.uint32)
    return per_order, lo, hi, np.concatenate([p.dep for p in parts])


def _range_rows(first: np.ndarray, lo: np.ndarray, hi: np.ndarray, dep: np.ndarray, vocab_size: int) -> tuple:
    """Rows of suffix_ranges for the trie keys (lo/hi/dep (K,), keys in sorted order, ``first``
    (K,) their first ids): the range of every id's first-token bucket at row = id (empty for
    ids absent from the corpus), then the longer keys. Returns (row per key (K,) int64,
    range lo (vocab_size + longer,) uint32, range hi)."""
    single = dep == 1
    sizes = np.zeros(vocab_size, np.int64)
    sizes[first[single]] = hi[single].astype(np.int64) - lo[single]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    if not np.array_equal(starts[first[single]], lo[single]):
        raise AssertionError("first-token buckets are not contiguous in id order")
    rows = np.empty(lo.size, np.int64)
    rows[single] = first[single]
    rows[~single] = vocab_size + np.arange(int((~single).sum()))
    range_lo = np.concatenate([starts[:-1], lo[~single]]).astype(np.uint32)
    range_hi = np.concatenate([starts[1:], hi[~single]]).astype(np.uint32)
    return rows, range_lo, range_hi


def write_parts(directory: Path, tokens: np.ndarray, sa: np.ndarray, parts: list[PartIndex], sizes: list[int],
                vocab_size: int, params: IndexParams) -> dict:
    """Write every data file of a datastore from the stream, its suffix array and the counted parts
    (``sizes[p]`` = suffix-array rows of part p). Returns the count dtype's name, the position
    width, the table's contexts per order, trie keys, seconds."""
    start = time.perf_counter()
    per_order, lo, hi, dep = _concat_parts(parts, sizes, params.max_order)
    firsts = sa[lo].astype(np.int64)[:, None] + np.arange(params.trie_depth)[None, :]
    key_ids = tokens[np.minimum(firsts, tokens.size - 1)]
    rows, lo, hi = _range_rows(key_ids[:, 0], lo, hi, dep, vocab_size)
    build_trie(encode_rows(key_ids, dep, key_width(vocab_size)), rows, directory / TRIE)
    trie_seconds = time.perf_counter() - start
    start = time.perf_counter()
    write_table(directory / TOKENS, {"token": tokens})
    bits = position_bits(tokens.size)
    write_table(directory / SUFFIX_ARRAY, {"word": pack_positions(sa, bits)})
    columns = _ngram_columns(per_order, params.max_order, tokens.dtype)
    write_table(directory / NGRAM, columns)
    write_table(directory / SUFFIX_RANGES, {"lo": lo, "hi": hi})
    return {
        "count_dtype": columns["total"].dtype.name,
        "position_bits": bits,
        "contexts_per_order": [int(len(t[3])) for t in per_order],
        "trie_keys": int(rows.size),
        "index_seconds": {"trie": round(trie_seconds, 3), "write": round(time.perf_counter() - start, 3)},
    }


def write_index(directory: Path, tokens: np.ndarray, vocab_size: int, sep: int, params: IndexParams) -> dict:
    """Write every data file of a datastore for ``tokens`` into ``directory`` (one process, one part).

    Returns statistics: contexts per order, trie keys, seconds per phase.
    """
    start = time.perf_counter()
    sa, lcp, svl = sort_suffixes(tokens, params.sort_depth, sep, params.lcp_cap)
    sort_seconds = time.perf_counter() - start
    start = time.perf_counter()
    part = index_part(tokens, sa, lcp, svl, params, threads=os.cpu_count() or 1)
    count_seconds = time.perf_counter() - start
    stats = write_parts(directory, tokens, sa, [part], [sa.size], vocab_size, params)
    stats["index_seconds"] = {"sort": round(sort_seconds, 3), "count": round(count_seconds, 3),
                              **stats["index_seconds"]}
    return stats
