"""Building, merging and the on-disk format of datastores."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retrieval_draft.errors import InvalidInputError
from retrieval_draft.store.layout import DATA_FILES, FORMAT_VERSION, MANIFEST
from retrieval_draft.store.manifest import file_sha256
from retrieval_draft.store.opening import open_datastore
from retrieval_draft.store.tokenizer import tokenizer_fingerprint
from retrieval_draft_datastore.builder import build, merge
from retrieval_draft_datastore.index import IndexParams
from retrieval_draft_datastore.sources import SourceOptions
from tests.datastore_fixtures import bpe_tokenizer, cli, stdlib_corpus, word_tokenizer

PY = SourceOptions(globs=("*.py",))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return stdlib_corpus(tmp_path_factory.mktemp("corpus") / "py")


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return bpe_tokenizer([p.read_text() for p in sorted(corpus.glob("*.py"))])


def test_build_writes_manifest_with_version_fingerprint_stats_and_checksums(tmp_path, corpus, tokenizer):
    manifest = build([str(corpus)], tmp_path / "ds", tokenizer, options=PY, progress=False)
    on_disk = json.loads((tmp_path / "ds" / MANIFEST).read_text())
    assert on_disk["format_version"] == FORMAT_VERSION
    assert on_disk["tokenizer"] == {"fingerprint": tokenizer_fingerprint(tokenizer), "vocab_size": len(tokenizer)}
    assert on_disk["stats"]["documents"] == 5 and on_disk["stats"]["tokens"] > 10000
    assert on_disk["params"] == IndexParams().to_dict()
    bits = (on_disk["stats"]["tokens"] - 1).bit_length()  # the widest position
    assert on_disk["storage"] == {"dtype": "uint16", "separator_id": 65535, "trie_key_width": 2,  # 400 ids < 64**2
                                  "count_dtype": "uint16", "position_bits": bits}  # every total < 65536
    for name in DATA_FILES:
        assert on_disk["files"][name]["sha256"] == file_sha256(tmp_path / "ds" / name)
    assert manifest["files"] == on_disk["files"]
    assert sorted(os.listdir(tmp_path)) == ["ds"]  # no temp directories left behind


def test_every_document_ends_with_a_separator(tmp_path, corpus, tokenizer):
    build([str(corpus)], tmp_path / "ds", tokenizer, options=PY, progress=False)
    store = open_datastore(tmp_path / "ds")
    expected = [np.array(tokenizer(p.read_text())["input_ids"]) for p in sorted(corpus.glob("*.py"))]
    joined = np.concatenate([np.append(ids, 65535) for ids in expected])
    assert np.array_equal(store.tokens, joined)


def test_merge_equals_building_from_the_union(tmp_path, corpus, tokenizer):
    files = sorted(corpus.glob("*.py"))
    build([str(f) for f in files[:2]], tmp_path / "a", tokenizer, progress=False)
    build([str(f) for f in files[2:]], tmp_path / "b", tokenizer, progress=False)
    build([str(f) for f in files], tmp_path / "union", tokenizer, progress=False)
    merged = merge(tmp_path / "a", tmp_path / "b", tmp_path / "ab")
    union = json.loads((tmp_path / "union" / MANIFEST).read_text())
    assert merged["files"] == union["files"]
    assert merged["stats"]["documents"] == union["stats"]["documents"] == 5


def test_jsonl_parquet_and_text_sources_are_read_in_order(tmp_path):
    tokenizer = word_tokenizer("one two three four five six".split())
    (tmp_path / "a.jsonl").write_text('{"body": "one two"}\n\n{"body": "three"}\n')
    pq.write_table(pa.table({"col": ["four", None, "five"]}), tmp_path / "b.parquet")
    (tmp_path / "c.txt").write_text("six")
    sources = [str(tmp_path / n) for n in ("a.jsonl", "b.parquet", "c.txt")]
    build(sources, tmp_path / "ds", tokenizer, options=SourceOptions(field="body", column="col"), progress=False)
    store = open_datastore(tmp_path / "ds")
    assert store.tokens.tolist() == [1, 2, 65535, 3, 65535, 4, 65535, 5, 65535, 6, 65535]
    assert store.manifest["stats"]["documents"] == 5


def test_directory_globs_select_files(tmp_path):
    tokenizer = word_tokenizer("kept skipped".split())
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "x.py").write_text("kept")
    (tmp_path / "src" / "y.txt").write_text("skipped")
    build([str(tmp_path / "src")], tmp_path / "ds", tokenizer, options=PY, progress=False)
    assert open_datastore(tmp_path / "ds").tokens.tolist() == [1, 65535]


def test_excluded_subtrees_are_skipped(tmp_path):
    from retrieval_draft_datastore.sources import SourceOptions, iter_documents

    (tmp_path / "src" / "site-packages" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "site-packages" / "pkg" / "a.py").write_text("vendored")
    (tmp_path / "src" / "test_b.py").write_text("a test")
    (tmp_path / "src" / "c.py").write_text("kept")
    options = SourceOptions(globs=("*.py",), excludes=("site-packages", "test_*"))
    assert list(iter_documents([str(tmp_path / "src")], options)) == ["kept"]


def test_missing_source_is_a_typed_error(tmp_path):
    with pytest.raises(InvalidInputError, match="source not found"):
        build([str(tmp_path / "nope")], tmp_path / "ds", word_tokenizer(["a"]), progress=False)


def test_cli_build_inspect_stats_and_merge(tmp_path, corpus, capsys):
    tok_dir = tmp_path / "tok"
    bpe_tokenizer([p.read_text() for p in sorted(corpus.glob("*.py"))]).save_pretrained(tok_dir)
    assert cli(["build", str(corpus / "bisect.py"), "--out", str(tmp_path / "a"), "--tokenizer", str(tok_dir),
                "--max-order", "3", "--top-k", "4", "--quiet"]) == 0
    assert cli(["build", str(corpus), "--glob", "heap*.py", "--out", str(tmp_path / "b"),
                "--tokenizer", str(tok_dir), "--max-order", "3", "--top-k", "4", "--quiet"]) == 0
    assert cli(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    assert cli(["stats", str(tmp_path / "c")]) == 0
    numbers = json.loads(capsys.readouterr().out)
    assert numbers["documents"] == 2 and numbers["params"]["max_order"] == 3 and numbers["params"]["top_k"] == 4
    assert len(numbers["contexts_per_order"]) == 3 and numbers["bytes_per_token_total"] > 0
    assert cli(["inspect", str(tmp_path / "c"), "--tokenizer", str(tok_dir), "--query", "def insort_left(a, x"]) == 0
    out = capsys.readouterr().out
    assert "tokens:" in out and "fingerprint=" in out and "suffix continuations" in out and "lo=0" in out


def test_real_smollm2_tokenizer_builds_and_drafts(tmp_path, corpus):
    from retrieval_draft.drafters.datastore import datastore_drafters
    from retrieval_draft.model.models import load_tokenizer

    tokenizer = load_tokenizer()
    assert len(tokenizer) == 49152
    build([str(corpus / "bisect.py")], tmp_path / "ds", tokenizer, progress=False)
    ngram, suffix = datastore_drafters(tmp_path / "ds", vocab_size=49152, tokenizer=tokenizer)
    context = np.array(tokenizer("def insort_left(a, x, lo=0, hi")["input_ids"])
    drafts = suffix.propose(context, 6)
    assert drafts and tokenizer.decode(drafts[0].tokens.tolist()).startswith("=None")
    assert ngram.propose(context, 6)


def test_file_urls_read_like_local_paths(tmp_path, corpus, tokenizer):
    local = build([str(corpus)], tmp_path / "local", tokenizer, options=PY, progress=False)
    remote = build([corpus.resolve().as_uri()], tmp_path / "url", tokenizer, options=PY, progress=False)
    assert remote["files"] == local["files"]
    with pytest.raises(InvalidInputError, match="source not found"):
        build([(tmp_path / "nope").as_uri()], tmp_path / "ds", tokenizer, progress=False)


def test_a_cli_build_compiles_the_runtime_store_queries_for_its_store(tmp_path, corpus, monkeypatch):
    """The first generate drafting from a store would otherwise compile the Numba query kernels
    (~7 s on 2 cores); the build runs every store drafter once on the new store instead."""
    from retrieval_draft.drafters import datastore as drafters_datastore
    from retrieval_draft.drafters import ngram, suffix

    tok_dir = tmp_path / "tok"
    bpe_tokenizer([p.read_text() for p in sorted(corpus.glob("*.py"))]).save_pretrained(tok_dir)
    asked = []
    for cls in (ngram.NgramDrafter, suffix.SuffixDrafter):
        real = cls.propose
        monkeypatch.setattr(cls, "propose", lambda self, context, max_len, real=real: asked.append(
            (self.name, context.dtype, context.size)) or real(self, context, max_len))
    compiled = []
    real_compile = drafters_datastore.compile_store_drafters
    monkeypatch.setattr(drafters_datastore, "compile_store_drafters",
                        lambda store: compiled.append(store.path) or real_compile(store))
    assert cli(["build", str(corpus / "bisect.py"), "--out", str(tmp_path / "a"), "--tokenizer", str(tok_dir),
                "--max-order", "3", "--quiet"]) == 0
    assert [Path(p).resolve() for p in compiled] == [(tmp_path / "a").resolve()]
    assert sorted(name for name, _, _ in asked) == ["ngram", "suffix"]
    assert all(dtype == np.int64 and size == 16 for _, dtype, size in asked)


def test_ray_options_without_the_ray_engine_are_refused(tmp_path, corpus):
    with pytest.raises(InvalidInputError, match="need --engine ray"):
        cli(["build", str(corpus), "--out", str(tmp_path / "ds"), "--workers", "2", "--quiet"])
