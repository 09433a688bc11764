"""Stores that follow a repository: git-aware listing, incremental updates, typed refusals."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import retrieval_draft_datastore.repo_store as repo_store
from retrieval_draft.drafters.suffix import SuffixDrafter
from retrieval_draft.errors import CorruptDatastoreError, InvalidInputError, TokenizerMismatchError
from retrieval_draft.store.layout import DATA_FILES, MANIFEST
from retrieval_draft.store.opening import open_datastore
from retrieval_draft_datastore.builder import build
from retrieval_draft_datastore.repo_cache import REPO_INDEX
from retrieval_draft_datastore.repo_store import update_repo_store
from retrieval_draft_datastore.sources import SourceOptions
from tests.datastore_fixtures import bpe_tokenizer, cli

SEP = 65535
FILES = {
    "README.md": "# demo\n\nA package that adds and scales numbers.\n",
    "pkg/alpha.py": "def alpha(x):\n    \"\"\"Twice x plus one.\"\"\"\n    return x * 2 + 1\n",
    "pkg/beta.py": "def beta(values):\n    return [v + 1 for v in values]\n",
    "pkg/gamma.py": "import math\n\n\ndef gamma(r):\n    return math.pi * r * r\n",
}
IGNORED = {".gitignore": "ignored/\n", "ignored/secret.py": "TOP_SECRET_TOKEN = 'do not index me'\n"}
NEW_BETA = ("def beta_rewritten(values, weight):\n    total = sum(weight * v * v for v in values)\n"
            "    return total / max(len(values), 1)\n")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def tokenizer():
    return bpe_tokenizer(list(FILES.values()) + list(IGNORED.values()) + [NEW_BETA], vocab_size=400)


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    _git(root, "init", "-q")
    _write(root, {**FILES, **IGNORED})
    _git(root, "add", "-A")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    return root


def _expected_stream(tokenizer, files: dict[str, str]) -> np.ndarray:
    """Every file's ids followed by the separator, files in path order."""
    ids = []
    for name in sorted(files, key=lambda p: tuple(p.split("/"))):
        ids += tokenizer(files[name], add_special_tokens=False)["input_ids"] + [SEP]
    return np.array(ids, dtype=np.uint16)


def _documents(tokenizer, store_path: Path) -> list[str]:
    """The store's documents decoded back to text."""
    tokens = open_datastore(store_path).tokens.tolist()
    docs, current = [], []
    for token in tokens:
        if token == SEP:
            docs.append(tokenizer.decode(current))
            current = []
        else:
            current.append(token)
    return docs


def _count_tokenised(monkeypatch) -> list[str]:
    """Record every text the repo store hands to the tokenizer."""
    seen: list[str] = []
    real = repo_store.encode_texts

    def counting(tokenizer, texts, vocab_size):
        seen.extend(texts)
        return real(tokenizer, texts, vocab_size)

    monkeypatch.setattr(repo_store, "encode_texts", counting)
    return seen


def _manifest_bytes(store: Path) -> bytes:
    return (store / MANIFEST).read_bytes()


def test_a_first_build_holds_every_tracked_source_file_in_path_order(repo, tmp_path, tokenizer):
    report = update_repo_store(repo, tmp_path / "store", tokenizer)
    assert (report.files, report.added, report.changed, report.deleted, report.unchanged) == (4, 4, 0, 0, 0)
    store = open_datastore(tmp_path / "store")
    assert np.array_equal(store.tokens, _expected_stream(tokenizer, FILES))
    assert store.manifest["repo"]["root"] == str(repo.resolve()) and store.manifest["repo"]["lister"] == "git"
    assert report.tokens == store.tokens.size


def test_an_ignored_file_is_never_indexed(repo, tmp_path, tokenizer):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    (repo / "ignored" / "late.py").write_text("LATE_SECRET = 2\n")  # ignored and never committed
    report = update_repo_store(repo, tmp_path / "store", tokenizer)
    assert report.files == 4
    assert not any("SECRET" in doc for doc in _documents(tokenizer, tmp_path / "store"))


def test_an_untracked_file_that_git_does_not_ignore_is_indexed(repo, tmp_path, tokenizer):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    _write(repo, {"pkg/delta.py": "def delta():\n    return 4\n"})
    report = update_repo_store(repo, tmp_path / "store", tokenizer)
    assert (report.added, report.unchanged) == (1, 4)
    assert "def delta():\n    return 4\n" in _documents(tokenizer, tmp_path / "store")


def test_updating_after_one_change_tokenises_only_that_file(repo, tmp_path, tokenizer, monkeypatch):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    seen = _count_tokenised(monkeypatch)
    _write(repo, {"pkg/beta.py": NEW_BETA})
    report = update_repo_store(repo, tmp_path / "store", tokenizer)
    assert seen == [NEW_BETA]
    assert (report.tokenised, report.changed, report.added, report.deleted, report.unchanged) == (1, 1, 0, 0, 3)


def test_an_update_with_nothing_changed_tokenises_nothing(repo, tmp_path, tokenizer, monkeypatch):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    seen = _count_tokenised(monkeypatch)
    report = update_repo_store(repo, tmp_path / "store", tokenizer)
    assert seen == [] and (report.tokenised, report.unchanged) == (0, 4)


def test_the_updated_store_drafts_the_new_text_and_the_old_text_is_gone(repo, tmp_path, tokenizer):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    _write(repo, {"pkg/beta.py": NEW_BETA})
    update_repo_store(repo, tmp_path / "store", tokenizer)
    docs = _documents(tokenizer, tmp_path / "store")
    assert NEW_BETA in docs and FILES["pkg/beta.py"] not in docs
    assert not any("[v + 1 for v in values]" in doc for doc in docs)
    ids = tokenizer(NEW_BETA, add_special_tokens=False)["input_ids"]
    drafts = SuffixDrafter(open_datastore(tmp_path / "store")).propose(np.array(ids[:12], dtype=np.int64), 8)
    assert drafts and len(drafts[0].tokens) >= 4
    assert drafts[0].tokens.tolist() == ids[12 : 12 + len(drafts[0].tokens)]


def test_deleting_a_file_removes_it(repo, tmp_path, tokenizer):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    _git(repo, "rm", "-q", "pkg/gamma.py")
    report = update_repo_store(repo, tmp_path / "store", tokenizer)
    assert (report.files, report.deleted, report.unchanged) == (3, 1, 3)
    remaining = {k: v for k, v in FILES.items() if k != "pkg/gamma.py"}
    assert np.array_equal(open_datastore(tmp_path / "store").tokens, _expected_stream(tokenizer, remaining))


def test_a_renamed_file_reuses_its_cached_ids(repo, tmp_path, tokenizer, monkeypatch):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    seen = _count_tokenised(monkeypatch)
    _git(repo, "mv", "pkg/alpha.py", "pkg/zeta.py")
    report = update_repo_store(repo, tmp_path / "store", tokenizer)
    assert seen == [] and (report.added, report.deleted, report.tokenised) == (1, 1, 0)


def test_an_updated_store_equals_a_fresh_build_of_the_same_tree(repo, tmp_path, tokenizer):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    _write(repo, {"pkg/beta.py": NEW_BETA, "pkg/delta.py": "DELTA = 4\n"})
    _git(repo, "rm", "-q", "pkg/gamma.py")
    update_repo_store(repo, tmp_path / "store", tokenizer)
    update_repo_store(repo, tmp_path / "fresh", tokenizer)
    updated, fresh = (json.loads(_manifest_bytes(tmp_path / name)) for name in ("store", "fresh"))
    assert updated["files"] == fresh["files"]  # sha256 of every data file
    assert updated["repo"]["index"] == fresh["repo"]["index"]
    assert (tmp_path / "store" / "tokens.arrow").read_bytes() == (tmp_path / "fresh" / "tokens.arrow").read_bytes()


def test_a_repo_store_streams_what_build_streams_for_the_same_files(repo, tmp_path, tokenizer):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    build([str(repo)], tmp_path / "built", tokenizer, options=SourceOptions(globs=("*.py", "*.md"),
                                                                            excludes=("ignored", ".*")),
          progress=False)
    assert np.array_equal(open_datastore(tmp_path / "store").tokens, open_datastore(tmp_path / "built").tokens)


def test_a_reader_holding_the_old_store_keeps_working(repo, tmp_path, tokenizer):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    old = open_datastore(tmp_path / "store")
    before = old.tokens.copy()
    _write(repo, {"pkg/beta.py": NEW_BETA})
    update_repo_store(repo, tmp_path / "store", tokenizer)
    assert np.array_equal(old.tokens, before)
    ids = tokenizer(FILES["pkg/alpha.py"], add_special_tokens=False)["input_ids"]
    assert SuffixDrafter(old).propose(np.array(ids[:6], dtype=np.int64), 4)


def test_a_directory_outside_git_is_walked_without_hidden_and_build_folders(tmp_path, tokenizer):
    _write(tmp_path / "plain", {"a.py": "A = 1\n", ".hidden/h.py": "H = 1\n", "build/b.py": "B = 1\n",
                                "node_modules/n.js": "n = 1\n", "notes.xyz": "not a source format\n"})
    report = update_repo_store(tmp_path / "plain", tmp_path / "store", tokenizer)
    store = open_datastore(tmp_path / "store")
    assert report.files == 1 and store.manifest["repo"]["lister"] == "walk"
    assert np.array_equal(store.tokens, _expected_stream(tokenizer, {"a.py": "A = 1\n"}))


def test_the_cli_prints_one_report_line(repo, tmp_path, tokenizer, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    argv = ["repo", str(repo), "--out", str(tmp_path / "store"), "--tokenizer", str(tmp_path / "tok")]
    assert cli(argv) == 0
    _write(repo, {"pkg/beta.py": NEW_BETA})
    assert cli(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    first = r"built .*store: 4 files \(0 changed, 4 added, 0 deleted, 0 unchanged\), \d+ tokens in \d+\.\d+ s"
    pattern = (r"updated .*store: 4 files \(1 changed, 0 added, 0 deleted, 3 unchanged\), \d+ tokens in "
               r"\d+\.\d+ s")
    assert len(lines) == 2 and re.fullmatch(first, lines[0]) and re.fullmatch(pattern, lines[1])


def test_bad_sources_fail_before_the_tokenizer_is_loaded(tmp_path):
    (tmp_path / "file.py").write_text("x = 1\n")
    missing_tokenizer = ["--tokenizer", str(tmp_path / "no-such-tokenizer")]
    with pytest.raises(InvalidInputError, match="source not found"):
        cli(["repo", str(tmp_path / "missing"), "--out", str(tmp_path / "store"), *missing_tokenizer])
    with pytest.raises(InvalidInputError, match="not a directory"):
        cli(["repo", str(tmp_path / "file.py"), "--out", str(tmp_path / "store"), *missing_tokenizer])
    assert not (tmp_path / "store").exists()


def test_an_out_that_is_not_a_repo_store_is_refused_and_kept(repo, tmp_path, tokenizer, monkeypatch):
    seen = _count_tokenised(monkeypatch)
    _write(tmp_path / "mine", {"notes.txt": "keep me\n"})
    with pytest.raises(InvalidInputError, match="not a datastore"):
        update_repo_store(repo, tmp_path / "mine", tokenizer)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me\n"
    build([str(repo / "pkg")], tmp_path / "plain-store", tokenizer, progress=False)
    before = _manifest_bytes(tmp_path / "plain-store")
    with pytest.raises(InvalidInputError, match="not a repo store"):
        update_repo_store(repo, tmp_path / "plain-store", tokenizer)
    assert _manifest_bytes(tmp_path / "plain-store") == before and seen == []


def test_a_store_of_another_tokenizer_or_root_is_refused_and_kept(repo, tmp_path, tokenizer, monkeypatch):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    before = _manifest_bytes(tmp_path / "store")
    seen = _count_tokenised(monkeypatch)
    other = bpe_tokenizer(["something else entirely"], vocab_size=300)
    with pytest.raises(TokenizerMismatchError):
        update_repo_store(repo, tmp_path / "store", other)
    _write(tmp_path / "elsewhere", {"x.py": "X = 1\n"})
    with pytest.raises(InvalidInputError, match="follows"):
        update_repo_store(tmp_path / "elsewhere", tmp_path / "store", tokenizer)
    assert _manifest_bytes(tmp_path / "store") == before and seen == []


def test_a_damaged_token_cache_is_a_typed_error_and_the_store_is_kept(repo, tmp_path, tokenizer):
    update_repo_store(repo, tmp_path / "store", tokenizer)
    index = tmp_path / "store" / REPO_INDEX
    data = bytearray(index.read_bytes())
    data[len(data) // 2] ^= 0xFF
    index.write_bytes(bytes(data))
    before = {name: (tmp_path / "store" / name).read_bytes() for name in DATA_FILES}
    with pytest.raises(CorruptDatastoreError, match=REPO_INDEX):
        update_repo_store(repo, tmp_path / "store", tokenizer)
    assert {name: (tmp_path / "store" / name).read_bytes() for name in DATA_FILES} == before
