"""Format version 2: the suffix order is local to a document, n-gram rows equal to their parent
are dropped, counts are narrow; drafts are exactly those of a version 1 store, which still opens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import retrieval_draft_datastore.index as index_module
from retrieval_draft.drafters.ngram import NgramDrafter
from retrieval_draft.drafters.suffix import SuffixDrafter
from retrieval_draft.store.arrow_io import write_table
from retrieval_draft.store.layout import MANIFEST, SUFFIX_ARRAY
from retrieval_draft.store.manifest import write_manifest
from retrieval_draft.store.reader import open_datastore
from retrieval_draft_datastore.builder import build
from retrieval_draft_datastore.kernels_sort import effective_depth, sort_suffixes
from retrieval_draft_datastore.sources import SourceOptions
from tests.datastore_fixtures import bpe_tokenizer, stdlib_corpus

PY = SourceOptions(globs=("*.py",))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_suffix_order_is_the_tokens_up_to_a_separator_then_the_position(dtype):
    rng = np.random.default_rng(3)
    sep = int(np.iinfo(dtype).max)
    for depth in (3, 8, 16):
        ids = rng.integers(0, 4, 600).astype(dtype)
        ids[rng.random(ids.size) < 0.05] = sep
        ids[-1] = sep
        h = effective_depth(depth, dtype)

        def key(p):
            window = ids[p : p + h].tolist()
            return (window[: window.index(sep) + 1] if sep in window else window), p

        assert sort_suffixes(ids, depth, sep).tolist() == sorted(range(ids.size), key=key)


def _version1_order(tokens: np.ndarray, depth: int) -> np.ndarray:
    """The version 1 order: the first ``depth`` tokens compared straight across separators."""
    padded = np.concatenate([tokens.astype(np.int64), np.full(depth, -1)])
    return np.array(sorted(range(tokens.size), key=lambda p: (padded[p : p + depth].tolist(), p)), np.uint32)


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[Path, Path, list[np.ndarray]]:
    """(a version 2 store, the same corpus as a version 1 store, some contexts) built from stdlib files."""
    root = tmp_path_factory.mktemp("format")
    corpus = stdlib_corpus(root / "py")
    tokenizer = bpe_tokenizer([p.read_text() for p in sorted(corpus.glob("*.py"))])
    build([str(corpus)], root / "v2", tokenizer, options=PY, progress=False)
    patch = pytest.MonkeyPatch()
    patch.setattr(index_module, "prune_ngrams", lambda per_order: per_order)
    patch.setattr(index_module, "narrow_counts", lambda count, total: (count, total))  # uint32, as in v1
    build([str(corpus)], root / "v1", tokenizer, options=PY, progress=False)
    patch.undo()
    old = open_datastore(root / "v1")
    write_table(root / "v1" / SUFFIX_ARRAY, {"pos": _version1_order(np.asarray(old.tokens), 16)})
    body = json.loads((root / "v1" / MANIFEST).read_text())
    body["format_version"] = 1
    del body["storage"]["count_dtype"], body["files"], body["manifest_sha256"]
    write_manifest(root / "v1", body)
    tokens = np.asarray(old.tokens, np.int64)
    contexts = [tokens[max(0, e - 40) : e] for e in range(3, tokens.size, 97)]  # some span a separator
    return root / "v2", root / "v1", contexts


def _drafts(drafter, contexts):
    return [[(d.tokens.tolist(), d.probs.tolist()) for d in drafter.propose(c, 12)] for c in contexts]


def test_version_1_stores_still_open_and_draft_exactly_like_version_2(stores):
    new, old, contexts = stores
    v2, v1 = open_datastore(new), open_datastore(old)
    assert (v1.manifest["format_version"], v2.manifest["format_version"]) == (1, 2)
    assert len(contexts) > 100
    assert _drafts(NgramDrafter(v2), contexts) == _drafts(NgramDrafter(v1), contexts)
    assert _drafts(SuffixDrafter(v2), contexts) == _drafts(SuffixDrafter(v1), contexts)


def test_version_2_spends_fewer_bytes_per_token(stores):
    new, old, _ = stores
    numbers = {}
    for name, path in (("v2", new), ("v1", old)):
        manifest = open_datastore(path).manifest
        files = manifest["files"]
        numbers[name] = (sum(f["bytes"] for f in files.values()) / manifest["stats"]["tokens"],
                         files["ngram.arrow"]["bytes"], manifest["stats"]["contexts_per_order"])
    (v2_total, v2_ngram, v2_rows), (v1_total, v1_ngram, v1_rows) = numbers["v2"], numbers["v1"]
    assert v2_rows[0] == v1_rows[0] and all(a <= b for a, b in zip(v2_rows, v1_rows)) and sum(v2_rows) < sum(v1_rows)
    assert v2_ngram < 0.6 * v1_ngram and v2_total < v1_total


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
