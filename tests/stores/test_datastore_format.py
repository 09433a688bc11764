"""Format version 3: positions packed at the bits the stream needs, only frequent contexts in
the n-gram table (rarer ones counted from the suffix array); drafts are exactly those of version 2
and version 1 stores of the same corpus, which still open."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import retrieval_draft_datastore.index as index_module
from retrieval_draft.drafters.ngram import NgramDrafter
from retrieval_draft.drafters.suffix import SuffixDrafter
from retrieval_draft.store.arrow_io import write_table
from retrieval_draft.store.layout import MANIFEST, NGRAM, SUFFIX_ARRAY, SUFFIX_RANGES, TRIE
from retrieval_draft.store.manifest import write_manifest
from retrieval_draft.store.opening import open_datastore
from retrieval_draft.store.suffix_trie import build_trie, encode_rows
from retrieval_draft_datastore.builder import build
from retrieval_draft_datastore.index import IndexParams
from retrieval_draft_datastore.kernels_count import count_ngrams, trie_ranges
from retrieval_draft_datastore.kernels_sort import sort_suffixes
from retrieval_draft_datastore.sources import SourceOptions
from tests.datastore_fixtures import bpe_tokenizer, stdlib_corpus

PY = SourceOptions(globs=("*.py",))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_suffix_order_is_the_tokens_up_to_a_separator_then_the_position(dtype):
    rng = np.random.default_rng(3)
    sep = int(np.iinfo(dtype).max)
    for depth in (3, 8, 12, 16):
        ids = rng.integers(0, 4, 600).astype(dtype)
        ids[rng.random(ids.size) < 0.05] = sep
        ids[-1] = sep

        def key(p):
            window = ids[p : p + depth].tolist()
            return (window[: window.index(sep) + 1] if sep in window else window), p

        assert sort_suffixes(ids, depth, sep)[0].tolist() == sorted(range(ids.size), key=key)


def _version1_order(tokens: np.ndarray, depth: int) -> np.ndarray:
    """The version 1 order: the first ``depth`` tokens compared straight across separators."""
    padded = np.concatenate([tokens.astype(np.int64), np.full(depth, -1)])
    return np.array(sorted(range(tokens.size), key=lambda p: (padded[p : p + depth].tolist(), p)), np.uint32)


def _rewrite_as(directory: Path, version: int, order: np.ndarray) -> None:
    """Turn a v3 store into an older one: plain positions in ``order``, a table of EVERY
    context with >= min_count continuations and trie rows in key order (what v1 and v2 stores hold)."""
    store = open_datastore(directory)
    tokens = np.array(store.tokens)
    params = IndexParams(**store.manifest["params"])
    sa, lcp, svl = sort_suffixes(tokens, params.sort_depth, store.separator, params.lcp_cap)
    per_order = [count_ngrams(tokens, sa, lcp, svl, n, params.top_k, params.min_count)
                 for n in range(1, params.max_order + 1)]
    columns = index_module._ngram_columns(per_order, params.max_order, tokens.dtype)
    lo, hi, dep = trie_ranges(lcp, svl, params.trie_depth, params.trie_min_count)
    key_ids = tokens[np.minimum(sa[lo].astype(np.int64)[:, None] + np.arange(params.trie_depth), tokens.size - 1)]
    build_trie(encode_rows(key_ids, dep, store.key_width), np.arange(lo.size), directory / TRIE)  # row = key order
    write_table(directory / SUFFIX_RANGES, {"lo": lo, "hi": hi})
    if version == 1:
        columns["count"], columns["total"] = columns["count"].astype(np.uint32), columns["total"].astype(np.uint32)
    write_table(directory / NGRAM, columns)
    write_table(directory / SUFFIX_ARRAY, {"pos": order})
    body = json.loads((directory / MANIFEST).read_text())
    body["format_version"] = version
    del body["storage"]["position_bits"], body["files"], body["manifest_sha256"]
    if version == 1:
        body["storage"]["count_dtype"] = "uint32"
    write_manifest(directory, body)


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[dict[int, Path], list[np.ndarray]]:
    """({version: store} of one stdlib corpus, some contexts); v3 with a table threshold that
    sends most contexts to the suffix array."""
    root = tmp_path_factory.mktemp("format")
    corpus = stdlib_corpus(root / "py")
    tokenizer = bpe_tokenizer([p.read_text() for p in sorted(corpus.glob("*.py"))])
    for version in (1, 2, 3):
        build([str(corpus)], root / f"v{version}", tokenizer, options=PY, params=IndexParams(table_min_total=16),
              progress=False)
    tokens = np.array(open_datastore(root / "v3").tokens)
    _rewrite_as(root / "v2", 2, open_datastore(root / "v3").suffix_array())
    _rewrite_as(root / "v1", 1, _version1_order(tokens, 16))
    contexts = [tokens[max(0, e - 40) : e].astype(np.int64) for e in range(3, tokens.size, 97)]  # some span a separator
    return {v: root / f"v{v}" for v in (1, 2, 3)}, contexts


def _drafts(drafter, contexts):
    return [[(d.tokens.tolist(), d.probs.tolist()) for d in drafter.propose(c, 12)] for c in contexts]


def test_version_1_and_2_stores_still_open_and_draft_exactly_like_version_3(stores):
    paths, contexts = stores
    opened = {v: open_datastore(p) for v, p in paths.items()}
    assert [opened[v].manifest["format_version"] for v in (1, 2, 3)] == [1, 2, 3]
    assert opened[3].position_bits < 32 and not opened[3].ngrams.complete and opened[2].ngrams.complete
    assert len(contexts) > 100
    expected = _drafts(NgramDrafter(opened[3]), contexts)
    assert sum(len(d) > 0 for d in expected) > len(contexts) // 2
    for v in (1, 2):
        assert _drafts(NgramDrafter(opened[v]), contexts) == expected
        assert _drafts(SuffixDrafter(opened[v]), contexts) == _drafts(SuffixDrafter(opened[3]), contexts)


def test_version_3_keeps_only_frequent_contexts_and_packs_positions(stores):
    paths, _ = stores
    v3, v2 = open_datastore(paths[3]), open_datastore(paths[2])
    assert np.array_equal(v3.suffix_array(), v2.suffix_array())
    assert v3.position_bits == max(1, (v3.tokens.size - 1).bit_length())
    files3, files2 = v3.manifest["files"], v2.manifest["files"]
    assert files3[SUFFIX_ARRAY]["bytes"] < files2[SUFFIX_ARRAY]["bytes"] * (v3.position_bits + 1) / 32
    assert files3[NGRAM]["bytes"] < 0.5 * files2[NGRAM]["bytes"]
    assert int(v3.ngrams.total.min()) >= 16 and int(v2.ngrams.total.min()) < 16


def test_counts_beyond_16_bits_are_scaled_within_a_few_1e_5_of_every_probability():
    rng = np.random.default_rng(4)
    total = np.array([10, 65_535, 65_536, 5_541_369, 900_000], np.uint32)
    count = np.zeros((5, 4), np.uint32)
    for r, t in enumerate(total):
        cuts = np.sort(rng.integers(0, int(t), 3))
        count[r] = np.sort(np.diff(np.concatenate([[0], cuts, [t]])))[::-1]
    count[3, 3] = 2  # a continuation rarer than 1 in 131,070 drops out
    narrow, narrow_total = index_module.narrow_counts(count, total)
    assert narrow.dtype == narrow_total.dtype == np.uint16
    assert np.array_equal(narrow[:2], count[:2]) and np.array_equal(narrow_total[:2], total[:2])
    for pseudo in (0.0, 1.0):
        exact = count / (total[:, None] + pseudo)
        stored = narrow / (narrow_total[:, None].astype(np.float64) + pseudo)
        assert np.abs(exact - stored).max() <= (pseudo + 0.5) / 65_536
    assert narrow[3, 3] == 0 and np.all(np.diff(narrow.astype(np.int64), axis=1) <= 0)
