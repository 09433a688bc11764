"""Every typed datastore error, provoked with real damaged files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrieval_draft.drafters.datastore import datastore_drafters
from retrieval_draft.errors import (
    CorruptDatastoreError,
    DatastoreNotFoundError,
    EmptyCorpusError,
    TokenIdOutOfRangeError,
    TokenizerMismatchError,
    UnknownFormatVersionError,
)
from retrieval_draft.store.arrow_io import write_table
from retrieval_draft.store.layout import MANIFEST, NGRAM, TOKENS, TRIE
from retrieval_draft.store.manifest import read_manifest, write_manifest
from retrieval_draft.store.opening import open_datastore
from retrieval_draft_datastore.builder import build
from tests.datastore_fixtures import word_tokenizer

WORDS = "the cat sat on a mat and dog ran".split()
TEXT = "the cat sat on the mat and the dog ran on the mat " * 20


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    (root / "doc.txt").write_text(TEXT)
    build([str(root / "doc.txt")], root / "ds", word_tokenizer(WORDS), progress=False)
    return root / "ds"


@pytest.fixture
def store_copy(pristine, tmp_path) -> Path:
    shutil.copytree(pristine, tmp_path / "ds")
    return tmp_path / "ds"


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_truncated_arrow_file_is_corrupt(store_copy):
    path = store_copy / TOKENS
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CorruptDatastoreError, match="truncated"):
        open_datastore(store_copy)


def test_flipped_byte_in_arrow_file_fails_its_checksum(store_copy):
    _flip(store_copy / NGRAM, 300)
    with pytest.raises(CorruptDatastoreError, match="sha256"):
        open_datastore(store_copy)


def test_flipped_bytes_in_trie_are_caught_before_loading_without_crashing(store_copy):
    for offset in (10, 100, 200, 400):
        _flip(store_copy / TRIE, offset)
    code = f"from retrieval_draft.store.opening import open_datastore\nopen_datastore({str(store_copy)!r})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 1  # a Python exception, not a signal
    assert "CorruptDatastoreError" in result.stderr and "suffix.trie: sha256 mismatch" in result.stderr


def test_edited_format_version_is_unknown(store_copy):
    body = json.loads((store_copy / MANIFEST).read_text())
    body["format_version"] = 99
    (store_copy / MANIFEST).write_text(json.dumps(body))
    with pytest.raises(UnknownFormatVersionError, match="99"):
        open_datastore(store_copy)


def test_edited_manifest_field_fails_the_manifest_checksum(store_copy):
    body = json.loads((store_copy / MANIFEST).read_text())
    body["stats"]["tokens"] += 1
    (store_copy / MANIFEST).write_text(json.dumps(body))
    with pytest.raises(CorruptDatastoreError, match="manifest checksum"):
        open_datastore(store_copy)


def test_a_missing_datastore_says_that_no_store_exists_there(tmp_path):
    with pytest.raises(DatastoreNotFoundError) as missing:
        open_datastore(tmp_path / "absent")
    assert str(missing.value) == f"no datastore at {tmp_path / 'absent'}: the path does not exist"
    assert isinstance(missing.value, FileNotFoundError)
    (tmp_path / "notes").mkdir()
    with pytest.raises(DatastoreNotFoundError, match="holds no manifest.json"):
        datastore_drafters(tmp_path / "notes", vocab_size=16)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatastoreNotFoundError, match="a file, not a datastore folder"):
        open_datastore(tmp_path / "file")


def test_tokenizer_a_store_opened_with_tokenizer_b_is_a_mismatch(pristine):
    other = word_tokenizer(list(reversed(WORDS)))
    with pytest.raises(TokenizerMismatchError):
        datastore_drafters(pristine, vocab_size=len(other), tokenizer=other)
    assert len(datastore_drafters(pristine, vocab_size=len(other), tokenizer=word_tokenizer(WORDS))) == 2


def test_store_vocabulary_larger_than_the_model_is_out_of_range(pristine):
    store_vocab = open_datastore(pristine).vocab_size
    with pytest.raises(TokenIdOutOfRangeError, match="larger than the model"):
        datastore_drafters(pristine, vocab_size=store_vocab - 1)


def test_a_store_of_another_tokenizer_says_to_rebuild_it_with_the_models(pristine):
    """The hint is a command the program takes (parsed by its own parser)."""
    from retrieval_draft_datastore.cli import build_parser

    hint = f"rebuild it with the model's: `retrieval-draft build SOURCES --out {pristine} --model <the model>`"
    store_vocab = open_datastore(pristine).vocab_size
    with pytest.raises(TokenIdOutOfRangeError) as wider:
        datastore_drafters(pristine, vocab_size=store_vocab - 1)
    other = word_tokenizer(list(reversed(WORDS)))
    with pytest.raises(TokenizerMismatchError) as mismatched:
        datastore_drafters(pristine, vocab_size=len(other), tokenizer=other)
    for error in (wider.value, mismatched.value):
        assert str(error).endswith(hint) and "\n" not in str(error)
    command = hint.split("`")[1].replace("<the model>", "smollm2-135m").split()
    parsed = build_parser().parse_args(command[1:])
    assert (parsed.command, parsed.out, parsed.model) == ("build", pristine, "smollm2-135m")


def test_stored_ids_at_or_above_the_vocabulary_are_out_of_range(store_copy):
    store = open_datastore(store_copy)
    tokens = np.array(store.tokens)
    tokens[0] = store.vocab_size  # a well-formed file with a bad id, re-checksummed
    del store
    write_table(store_copy / TOKENS, {"token": tokens})
    body = read_manifest(store_copy)
    write_manifest(store_copy, {k: v for k, v in body.items() if k != "files"})
    with pytest.raises(TokenIdOutOfRangeError, match="outside the vocabulary"):
        open_datastore(store_copy)


def test_empty_corpus_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n")
    with pytest.raises(EmptyCorpusError):
        build([str(tmp_path / "empty.txt"), str(tmp_path / "blank.jsonl")], tmp_path / "ds",
              word_tokenizer(WORDS), progress=False)
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("sharded", [False, True], ids=["flat", "sharded"])
def test_an_empty_corpus_names_its_sources_and_glob(tmp_path, sharded):
    from retrieval_draft_datastore.shard_build import build_sharded
    from retrieval_draft_datastore.sources import SourceOptions

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("the cat")
    (tmp_path / "empty.txt").write_text("")
    sources = [str(tmp_path / "docs"), str(tmp_path / "empty.txt")]
    options = SourceOptions(globs=("*.py",), excludes=("test*",))
    with pytest.raises(EmptyCorpusError) as empty:
        if sharded:
            build_sharded(sources, tmp_path / "ds", word_tokenizer(WORDS), 64, options=options, progress=False)
        else:
            build(sources, tmp_path / "ds", word_tokenizer(WORDS), options=options, progress=False)
    assert str(empty.value) == (f"the corpus produced no tokens: no text in {sources[0]}, {sources[1]} "
                                "(glob '*.py', exclude 'test*')")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs", "empty.txt"]


def test_failed_build_leaves_the_previous_datastore_intact(store_copy, tmp_path):
    before = {p.name: p.read_bytes() for p in store_copy.iterdir()}
    (tmp_path / "bad.jsonl").write_text('{"text": "the cat"}\nnot json\n')
    with pytest.raises(Exception, match="invalid JSON"):
        build([str(tmp_path / "bad.jsonl")], store_copy, word_tokenizer(WORDS), progress=False)
    assert {p.name: p.read_bytes() for p in store_copy.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp dir removed
    open_datastore(store_copy)


def test_rebuild_replaces_the_datastore_atomically(store_copy, tmp_path):
    (tmp_path / "new.txt").write_text("dog ran")
    build([str(tmp_path / "new.txt")], store_copy, word_tokenizer(WORDS), progress=False)
    assert open_datastore(store_copy).manifest["stats"]["tokens"] == 3
