"""`retrieval-draft export STORE --llama-cpp OUT`: llama.cpp's static lookup cache from a store."""

from __future__ import annotations

import struct
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from retrieval_draft.errors import DatastoreNotFoundError, InvalidInputError
from retrieval_draft.store.layout import NGRAM
from retrieval_draft.store.opening import open_datastore
from retrieval_draft_datastore.builder import build
from retrieval_draft_datastore.cli import main
from retrieval_draft_datastore.index import IndexParams
from retrieval_draft_datastore.llama_export import bigram_counts, export_llama_cpp
from retrieval_draft_datastore.lookup_cache import CorruptLookupCacheError, encode_records, read_lookup_cache
from retrieval_draft_datastore.shard_build import build_sharded
from tests.datastore_fixtures import word_tokenizer

WORDS = "the cat sat on a mat and dog ran".split()
DOCS = {
    "a.txt": "the cat sat on the mat and the dog ran on the mat " * 12,
    "b.txt": "a dog sat on a cat and ran",
    "c.txt": "the mat sat",
    "d.txt": "on the mat a cat ran and the cat sat " * 3,
}


def _corpus(root: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in DOCS.items():
        (root / name).write_text(text)
    return [str(root / name) for name in DOCS]


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export")
    sources, tokenizer = _corpus(root / "corpus"), word_tokenizer(WORDS)
    build(sources, root / "flat", tokenizer, progress=False)
    build_sharded(sources, root / "sharded", tokenizer, 60, progress=False)
    return {"flat": root / "flat", "sharded": root / "sharded"}


def _stream_counts(tokens: list[int], sep: int) -> dict[tuple[int, ...], dict[int, int]]:
    """2-token contexts and their next tokens counted straight from a stream, documents apart."""
    counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for a, b, c in zip(tokens, tokens[1:], tokens[2:]):
        if sep not in (a, b, c):
            counts[(a, b, -1, -1)][c] += 1
    return {key: dict(part) for key, part in counts.items()}


def test_the_exported_counts_equal_the_token_streams_two_token_counts(stores, tmp_path):
    summary = export_llama_cpp(stores["flat"], tmp_path / "static.bin")
    store = open_datastore(stores["flat"])
    expected = _stream_counts(store.tokens.tolist(), store.separator)
    assert read_lookup_cache(tmp_path / "static.bin") == expected
    assert summary.contexts == len(expected)
    assert summary.continuations == sum(len(part) for part in expected.values())
    assert summary.windows == sum(sum(part.values()) for part in expected.values())
    assert summary.bytes == (tmp_path / "static.bin").stat().st_size == 20 * summary.contexts + 8 * summary.continuations


def test_a_context_keeps_every_next_token_where_the_table_keeps_its_top_k(tmp_path):
    params = IndexParams(top_k=1, min_count=1, table_min_total=1)
    build(_corpus(tmp_path / "corpus"), tmp_path / "top1", word_tokenizer(WORDS), params=params, progress=False)
    store = open_datastore(tmp_path / "top1")
    export_llama_cpp(tmp_path / "top1", tmp_path / "static.bin")
    exported = read_lookup_cache(tmp_path / "static.bin")
    assert exported == _stream_counts(store.tokens.tolist(), store.separator)
    assert store.ngrams.next.shape[1] == 1 and max(len(part) for part in exported.values()) > 1


def test_a_sharded_store_exports_what_one_index_of_the_same_corpus_does(stores, tmp_path):
    assert len(open_datastore(stores["sharded"]).shards) > 1
    export_llama_cpp(stores["flat"], tmp_path / "flat.bin")
    export_llama_cpp(stores["sharded"], tmp_path / "sharded.bin")
    assert read_lookup_cache(tmp_path / "sharded.bin") == read_lookup_cache(tmp_path / "flat.bin")


def test_counting_in_many_passes_gives_the_counts_of_one_pass(stores):
    store = open_datastore(stores["flat"])

    def records(windows_per_pass: int) -> tuple[int, dict]:
        found, passes = {}, 0
        for ctx, nexts, counts, starts, _ in bigram_counts([store.tokens], store.separator, store.vocab_size,
                                                           windows_per_pass=windows_per_pass):
            passes += 1
            bounds = np.append(starts, nexts.size)
            for g, (a, b) in enumerate(ctx.tolist()):
                found[(a, b)] = dict(zip(nexts[bounds[g]:bounds[g + 1]].tolist(),
                                         counts[bounds[g]:bounds[g + 1]].tolist()))
        return passes, found

    one_passes, one = records(10**9)
    many_passes, many = records(5)
    assert (one_passes, many_passes > 3) == (1, True)
    assert many == one


def test_min_total_leaves_out_exactly_the_rarer_contexts(stores, tmp_path):
    export_llama_cpp(stores["flat"], tmp_path / "all.bin")
    export_llama_cpp(stores["flat"], tmp_path / "five.bin", min_total=5)
    every = read_lookup_cache(tmp_path / "all.bin")
    assert read_lookup_cache(tmp_path / "five.bin") == {k: v for k, v in every.items() if sum(v.values()) >= 5}
    assert 0 < len(read_lookup_cache(tmp_path / "five.bin")) < len(every)


def test_a_record_is_laid_out_as_llama_cpps_common_ngram_cache_save_writes_it():
    data = encode_records(np.array([[5, 7], [9, 2]]), np.array([1, 2, 3]), np.array([3, 4, 8]), np.array([0, 2]))
    # common_ngram (4 x int32, -1 padded), int32 n, then n x (int32 token, int32 count), little-endian
    assert data.tobytes() == struct.pack("<9i7i", 5, 7, -1, -1, 2, 1, 3, 2, 4, 9, 2, -1, -1, 1, 3, 8)


def test_a_vocabulary_past_16_bits_exports_its_ids(tmp_path):
    tokenizer = word_tokenizer(WORDS, extra=70_000)
    (tmp_path / "doc.txt").write_text("w69999 the cat w65600 w69999 the cat w65600 sat")
    build([str(tmp_path / "doc.txt")], tmp_path / "wide", tokenizer, progress=False)
    assert open_datastore(tmp_path / "wide").tokens.dtype == np.uint32
    export_llama_cpp(tmp_path / "wide", tmp_path / "wide.bin")
    ids = tokenizer("w69999 the cat w65600", add_special_tokens=False)["input_ids"]
    assert ids[0] > 65535 and ids[3] > 65535
    assert read_lookup_cache(tmp_path / "wide.bin")[(ids[1], ids[2], -1, -1)] == {ids[3]: 2}


def _first_record(data: bytes) -> bytes:
    return data[:20 + 8 * struct.unpack_from("<i", data, 16)[0]]


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[:-4], "follow"),  # the last count cut off
    (lambda b: b + b"\x00\x00", "whole number"),
    (lambda b: b[:16] + struct.pack("<i", 0) + b[20:], "has 0 next tokens"),
    (lambda b: b + _first_record(b), "repeats"),  # a key twice: llama.cpp would keep the first silently
    (lambda b: b[:24] + struct.pack("<i", 0) + b[28:], "count below 1"),
])
def test_the_reader_refuses_a_damaged_cache_with_one_typed_line(stores, tmp_path, damage, words):
    export_llama_cpp(stores["flat"], tmp_path / "static.bin")
    (tmp_path / "bad.bin").write_bytes(damage((tmp_path / "static.bin").read_bytes()))
    with pytest.raises(CorruptLookupCacheError, match=words) as error:
        read_lookup_cache(tmp_path / "bad.bin")
    assert "\n" not in str(error.value)


def test_bad_input_is_a_typed_one_line_error_before_the_store_is_read(stores, tmp_path):
    (tmp_path / "folder").mkdir()
    cases = [
        (dict(store_path=tmp_path / "nowhere", out=tmp_path / "x.bin"), DatastoreNotFoundError, "no datastore"),
        (dict(store_path=stores["flat"], out=tmp_path / "folder"), InvalidInputError, "is a folder"),
        (dict(store_path=stores["flat"], out=tmp_path / "no" / "x.bin"), InvalidInputError, "does not exist"),
        (dict(store_path=stores["flat"], out=stores["flat"] / "x.bin"), InvalidInputError, "inside the datastore"),
        (dict(store_path=stores["flat"], out=stores["flat"] / NGRAM), InvalidInputError, "inside the datastore"),
        (dict(store_path=stores["flat"], out=tmp_path / "x.bin", min_total=0), InvalidInputError, "--min-total"),
    ]
    for kwargs, kind, words in cases:
        with pytest.raises(kind, match=words) as error:
            export_llama_cpp(**kwargs)
        assert "\n" not in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]  # nothing written, no temp file left


def test_the_command_replaces_an_existing_file_and_prints_one_line(stores, tmp_path, capsys):
    out = tmp_path / "static.bin"
    out.write_bytes(b"old")
    assert main(["export", str(stores["flat"]), "--llama-cpp", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith(f"exported {out}: ")
    export_llama_cpp(stores["flat"], tmp_path / "fresh.bin")
    assert out.read_bytes() == (tmp_path / "fresh.bin").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.bin", "static.bin"]  # no temp file left


def test_the_command_prints_a_bad_store_as_one_error_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nowhere"), "--llama-cpp", str(tmp_path / "x.bin")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "no datastore" in err[0]
