"""Sharded stores (format 4): one store made of shards of whole documents, queried as one, drafting
exactly as the one-shard and the flat build of the same corpus; a damaged or missing shard is one
typed line naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from retrieval_draft.drafters.datastore import datastore_drafters
from retrieval_draft.drafters.ngram import NgramDrafter
from retrieval_draft.drafters.suffix import SuffixDrafter
from retrieval_draft.errors import CorruptDatastoreError, InvalidInputError
from retrieval_draft.store.layout import MANIFEST, NGRAM, SUFFIX_ARRAY, TOKENS
from retrieval_draft.store.reader import Datastore
from retrieval_draft.store.opening import open_datastore
from retrieval_draft.store.sharded import ShardedDatastore
from retrieval_draft.store.store_cache import StoreCache
from retrieval_draft_datastore.builder import build
from retrieval_draft_datastore.index import IndexParams
from retrieval_draft_datastore.shard_build import build_sharded, split_shards
from retrieval_draft_datastore.sources import SourceOptions
from tests.datastore_fixtures import bpe_tokenizer, cli, stdlib_corpus

PY = SourceOptions(globs=("*.py",))
PARAMS = IndexParams(table_min_total=8)  # most contexts counted from the suffix arrays, some from the table
SMALL_SHARD = 2000  # tokens: the corpus makes about 16 shards


def _pieces(modules: Path, target: Path, lines: int = 40) -> Path:
    """The modules cut into files of ``lines`` lines (many small documents); returns ``target``."""
    target.mkdir()
    for module in sorted(modules.glob("*.py")):
        text = module.read_text().splitlines(keepends=True)
        for i in range(0, len(text), lines):
            (target / f"{module.stem}_{i // lines:03d}.py").write_text("".join(text[i : i + lines]))
    return target


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(root, tokenizer): the corpus as a flat store, a one-shard store and a many-shard store."""
    root = tmp_path_factory.mktemp("sharded")
    corpus = _pieces(stdlib_corpus(root / "modules"), root / "py")
    tokenizer = bpe_tokenizer([p.read_text() for p in sorted(corpus.glob("*.py"))])
    build([str(corpus)], root / "flat", tokenizer, options=PY, params=PARAMS, progress=False)
    build_sharded([str(corpus)], root / "one", tokenizer, 10**9, options=PY, params=PARAMS, progress=False)
    build_sharded([str(corpus)], root / "many", tokenizer, SMALL_SHARD, options=PY, params=PARAMS, progress=False)
    return root, tokenizer


def _contexts(store: Datastore, count: int = 300, length: int = 24) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    tokens = np.asarray(store.tokens)
    found = []
    while len(found) < count:
        p = int(rng.integers(length, tokens.size))
        window = tokens[p - length : p].astype(np.int64)
        if not np.any(window == store.separator):
            found.append(window)
    return found


def _drafts(store, contexts) -> list:
    drafters = (NgramDrafter(store), SuffixDrafter(store))
    return [[(d.tokens.tolist(), d.probs.tolist()) for d in drafter.propose(c, 10)]
            for drafter in drafters for c in contexts]


def test_a_corpus_drafts_the_same_as_one_shard_many_shards_and_a_flat_store(built):
    root, _ = built
    flat, one, many = (open_datastore(root / name) for name in ("flat", "one", "many"))
    assert isinstance(one, ShardedDatastore) and len(one.shards) == 1 and len(many.shards) >= 12
    contexts = _contexts(flat)
    expected = _drafts(flat, contexts)
    assert sum(bool(d) for d in expected) > len(expected) * 0.8  # the contexts draft
    assert _drafts(one, contexts) == expected
    assert _drafts(many, contexts) == expected


def test_the_store_table_is_the_one_shard_table_byte_for_byte(built):
    root, _ = built
    flat_table = (root / "flat" / NGRAM).read_bytes()
    assert (root / "one" / NGRAM).read_bytes() == flat_table
    assert (root / "many" / NGRAM).read_bytes() == flat_table


def test_shards_hold_whole_documents_within_the_shard_size_and_the_whole_stream_in_order(built):
    root, _ = built
    flat, many = open_datastore(root / "flat"), open_datastore(root / "many")
    for shard in many.shards:
        assert shard.tokens.size <= SMALL_SHARD and shard.tokens[-1] == many.separator
    assert np.array_equal(np.concatenate([s.tokens for s in many.shards]), flat.tokens)
    assert many.manifest["stats"]["documents"] == flat.manifest["stats"]["documents"]


def test_splitting_takes_one_shard_at_a_time_and_gives_a_long_document_its_own_shard():
    sep = 9
    docs = [[1, 2, sep], [3, sep], [4, 5, 6, 7, 8, 1, sep], [2, sep], [3, 3, sep]]
    consumed = []

    def chunks():
        for i, doc in enumerate(docs):
            consumed.append(i)
            yield np.array(doc)

    shards = split_shards(chunks(), 5, sep)
    assert next(shards).tolist() == [1, 2, sep, 3, sep] and consumed == [0, 1, 2]  # not read ahead
    assert [s.tolist() for s in shards] == [[4, 5, 6, 7, 8, 1, sep], [2, sep, 3, 3, sep]]


def test_drafters_named_by_path_open_a_sharded_store_once_per_process(built):
    root, tokenizer = built
    cache = StoreCache()
    first = cache.open(root / "many")
    assert cache.open(root / "many") is first
    drafters = datastore_drafters(first, vocab_size=len(tokenizer), tokenizer=None)
    assert [d.name for d in drafters] == ["ngram", "suffix"]  # one drafter per kind for the whole store


@pytest.fixture
def copy(built, tmp_path):
    root, _ = built
    target = tmp_path / "store"
    shutil.copytree(root / "many", target)
    return target


def test_a_damaged_shard_file_is_one_typed_line_naming_the_shard(copy):
    path = copy / "shard-00003" / SUFFIX_ARRAY
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDatastoreError, match=r"^shard shard-00003: suffix_array.arrow: sha256 mismatch"):
        open_datastore(copy)


def test_a_missing_shard_is_one_typed_line_and_nothing_is_cached(copy):
    shutil.rmtree(copy / "shard-00002")
    cache = StoreCache()
    with pytest.raises(CorruptDatastoreError, match=r"^shard shard-00002: ") as error:
        cache.open(copy)
    assert "\n" not in str(error.value) and len(cache) == 0


def test_a_shard_swapped_for_another_shard_is_refused(copy):
    shutil.rmtree(copy / "shard-00001")
    shutil.copytree(copy / "shard-00004", copy / "shard-00001")
    with pytest.raises(CorruptDatastoreError, match=r"^shard shard-00001: manifest.json differs"):
        open_datastore(copy)


def test_a_verified_store_damaged_in_place_is_verified_again(copy):
    cache = StoreCache()
    cache.open(copy)
    path = copy / "shard-00005" / TOKENS
    data = bytearray(path.read_bytes())
    data[-40] ^= 0x01
    path.write_bytes(bytes(data))  # in place: the shard file's identity changes
    with pytest.raises(CorruptDatastoreError, match=r"^shard shard-00005: tokens.arrow"):
        StoreCache().open(copy)  # a new process: the verified record no longer matches


def test_the_cli_builds_a_sharded_store_and_inspect_lists_its_shards(built, tmp_path, monkeypatch, capsys):
    root, tokenizer = built
    import retrieval_draft_datastore.commands as commands

    monkeypatch.setattr(commands, "_tokenizer", lambda args: tokenizer)
    assert cli(["build", str(root / "py"), "--out", str(tmp_path / "s"), "--glob", "*.py", "--quiet",
                "--shard-tokens", "5000", "--table-min-total", "8"]) == 0
    assert cli(["inspect", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    shards = json.loads((tmp_path / "s" / MANIFEST).read_text())["shards"]
    assert f"shards: {len(shards)}" in out and len(shards) > 1
    assert all(f"{s['dir']}: {s['tokens']} tokens" in out for s in shards)
    assert (tmp_path / "s" / NGRAM).read_bytes() == (root / "flat" / NGRAM).read_bytes()


def test_a_bad_shard_size_fails_before_the_tokenizer_loads(tmp_path, monkeypatch):
    import retrieval_draft_datastore.commands as commands

    def no_tokenizer(args):
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr(commands, "_tokenizer", no_tokenizer)
    with pytest.raises(InvalidInputError, match="--shard-tokens"):
        cli(["build", str(tmp_path), "--out", str(tmp_path / "s"), "--shard-tokens", "0"])


def test_each_shards_rare_context_filter_keeps_the_rare_contexts_it_holds_and_rules_out_most_others(built):
    from retrieval_draft.store.query import narrow_range
    from retrieval_draft.store.rare_filter import context_hash, may_contain
    from retrieval_draft_datastore.kernels_count import count_ngrams
    from retrieval_draft_datastore.kernels_sort import sort_suffixes

    root, _ = built
    flat, many = open_datastore(root / "flat"), open_datastore(root / "many")
    words, offsets = many.ngrams.rare_filter, many.ngrams.rare_offsets
    filters = [words[offsets[i] : offsets[i + 1]] for i in range(len(many.shards))]
    tokens = np.asarray(flat.tokens)
    sa, lcp, svl = sort_suffixes(tokens, PARAMS.sort_depth, flat.separator, PARAMS.lcp_cap)
    held = 0
    for n in range(1, PARAMS.max_order + 1):
        ctx, _, _, tot = count_ngrams(tokens, sa, lcp, svl, n, PARAMS.top_k, PARAMS.min_count)
        for row in ctx[tot < PARAMS.table_min_total].astype(np.int64):
            h = np.uint64(context_hash(row))
            for shard, words_i in zip(many.shards, filters):
                a, b = narrow_range(shard.tokens, shard.suffix_words, shard.position_bits, 0, shard.tokens.size, row)
                if b > a:
                    held += 1
                    assert may_contain(words_i, h)  # no false negatives: counts, so drafts, cannot change
    assert held > 100
    rng = np.random.default_rng(1)
    absent = [np.uint64(context_hash(rng.integers(0, many.vocab_size, 4))) for _ in range(1000)]  # unseen 4-grams
    assert sum(may_contain(f, h) for f in filters for h in absent) < 0.03 * len(filters) * len(absent)
