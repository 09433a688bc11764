"""Numba kernels: suffix sorting, n-gram counting, trie key encoding, id widths."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from retrieval_draft.store.layout import separator_id, token_dtype
from retrieval_draft.store.suffix_trie import encode_ids, encode_rows, key_width
from retrieval_draft_datastore.index import IndexParams, write_index
from retrieval_draft_datastore.kernels_count import capped_lcp, count_ngrams, trie_ranges, valid_lengths
from retrieval_draft_datastore.kernels_sort import sort_suffixes


def _random_stream(rng, n, alphabet, dtype):
    sep = separator_id(dtype)
    ids = rng.integers(0, alphabet, n).astype(dtype)
    ids[rng.random(n) < 0.05] = sep
    ids[-1] = sep
    return ids, sep


def _until_sep(seq, sep):
    seq = list(seq)
    return tuple(seq[: seq.index(sep) + 1]) if sep in seq else tuple(seq)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_suffix_array_is_sorted_permutation_up_to_depth(dtype):
    rng = np.random.default_rng(1)
    for _ in range(30):
        ids, sep = _random_stream(rng, int(rng.integers(1, 400)), 5, dtype)
        sa = sort_suffixes(ids, 8, int(ids[-1]))[0]
        assert sorted(sa.tolist()) == list(range(ids.size))
        keys = [_until_sep(ids[p : p + 8], sep) for p in sa]
        assert keys == sorted(keys)


def test_suffix_sort_is_deterministic_and_dtype_independent():
    rng = np.random.default_rng(2)
    ids16, _ = _random_stream(rng, 3000, 3, np.uint16)
    ids32 = ids16.astype(np.uint32)
    ids32[ids16 == separator_id(np.uint16)] = separator_id(np.uint32)
    first = sort_suffixes(ids16, 16, int(ids16[-1]), 5)
    for again in (sort_suffixes(ids16, 16, int(ids16[-1]), 5), sort_suffixes(ids32, 16, int(ids32[-1]), 5)):
        assert all(np.array_equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
@pytest.mark.parametrize("depth", [2, 5, 9, 12, 16, 24])
def test_the_sort_yields_the_capped_prefix_arrays_the_counting_scans(dtype, depth):
    """Every sort path (window only, rank round, deeper windows) returns lcp/svl equal to a direct scan."""
    rng = np.random.default_rng(depth)
    ids, sep = _random_stream(rng, 4000, 3, dtype)
    for cap in (1, 3, 5, 9):
        if cap > depth:
            continue
        sa, lcp, svl = sort_suffixes(ids, depth, sep, cap)
        vlen = valid_lengths(ids, sep, cap)
        assert np.array_equal(lcp, capped_lcp(ids, sa, vlen, cap)) and np.array_equal(svl, vlen[sa])
        keys = [(_until_sep(ids[p : p + depth], sep), p) for p in sa.tolist()]
        assert keys == sorted(keys)


def test_buckets_long_enough_for_the_radix_paths_sort_exactly():
    """First-token buckets of ~30k positions take the 16-bit split and radix passes, their runs
    the 8-bit radix; a skewed alphabet adds long runs of equal windows for the rank round."""
    rng = np.random.default_rng(7)
    ids, sep = _random_stream(rng, 100_000, 3, np.uint16)
    ids[rng.random(ids.size) < 0.5] = 0
    ids[-1] = sep
    sa = sort_suffixes(ids, 16, sep)[0]
    keys = [(_until_sep(ids[p : p + 16], sep), p) for p in range(ids.size)]
    assert sa.tolist() == sorted(range(ids.size), key=keys.__getitem__)


def _reference_counts(ids, sep, n):
    counts: dict[tuple, Counter] = {}
    for i in range(ids.size - n):
        window = ids[i : i + n + 1].tolist()
        if sep not in window:
            counts.setdefault(tuple(window[:n]), Counter())[window[n]] += 1
    return counts


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_ngram_counts_match_a_python_counter_and_never_cross_separators(dtype):
    rng = np.random.default_rng(3)
    ids, sep = _random_stream(rng, 5000, 6, dtype)
    sa, lcp, svl = sort_suffixes(ids, 8, int(ids[-1]), 5)
    for n in (1, 2, 3, 4):
        ctx, nxt, cnt, tot = count_ngrams(ids, sa, lcp, svl, n, 3, 1)
        ref = _reference_counts(ids, sep, n)
        assert len(ctx) == len(ref)
        for row in range(len(ctx)):
            counter = ref[tuple(ctx[row].tolist())]
            assert tot[row] == sum(counter.values())
            expected = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            got = [(int(t), int(c)) for t, c in zip(nxt[row], cnt[row]) if c > 0]
            assert got == expected


def test_min_count_drops_rare_contexts():
    ids = np.array([1, 2, 3, 1, 2, 4, 5, 6, 65535], np.uint16)
    sa, lcp, svl = sort_suffixes(ids, 8, int(ids[-1]), 3)
    ctx, _, _, tot = count_ngrams(ids, sa, lcp, svl, 2, 4, 2)
    assert ctx.tolist() == [[1, 2]] and tot.tolist() == [2]


def test_trie_ranges_cover_every_occurrence_in_sorted_key_order():
    rng = np.random.default_rng(4)
    ids, sep = _random_stream(rng, 2000, 4, np.uint16)
    sa, lcp, svl = sort_suffixes(ids, 8, int(ids[-1]), 3)
    lo, hi, dep = trie_ranges(lcp, svl, 3, 1)
    keys = [tuple(ids[sa[a] : sa[a] + d].tolist()) for a, d in zip(lo, dep)]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    for key, a, b in zip(keys, lo, hi):
        occurrences = [i for i in range(ids.size - len(key) + 1) if tuple(ids[i : i + len(key)].tolist()) == key]
        assert sorted(sa[a:b].tolist()) == occurrences


def test_uint32_storage_keeps_ids_above_65535_untruncated(tmp_path):
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32
    big = np.array([70000, 262143, 5, 70000, 262143, 6, 4294967295], np.uint32)
    params = IndexParams(max_order=2, top_k=2, min_count=1, sort_depth=4, trie_depth=2, table_min_total=1)
    stats = write_index(tmp_path, big, 262144, separator_id(np.uint32), params)
    import pyarrow as pa

    from retrieval_draft.store.arrow_io import read_table

    assert read_table(tmp_path / "tokens.arrow", {"token": pa.uint32()})["token"].tolist() == big.tolist()
    table = read_table(tmp_path / "ngram.arrow", {"next": pa.list_(pa.uint32(), 2), "context": pa.list_(pa.uint32(), 2)})
    assert 262143 in table["next"] and 70000 in table["context"]
    assert stats["contexts_per_order"][0] == 3


def test_trie_keys_use_fixed_width_small_alphabet_digits_in_id_order():
    assert key_width(64) == 1 and key_width(65) == 2 and key_width(49152) == 3 and key_width(262144) == 3
    assert key_width(262145) == 4
    ids = np.array([[0, 300], [254, 0], [255, 1], [64000, 7], [262143, 0]])
    keys = encode_rows(ids, np.array([2, 1, 2, 2, 1]), 3)
    assert keys == [encode_ids(row[:n], 3) for row, n in zip(ids.tolist(), [2, 1, 2, 2, 1])]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert all(1 <= ord(ch) <= 64 for key in keys for ch in key)
    assert len(keys[1]) == 3 and len(keys[0]) == 6
