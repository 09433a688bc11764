"""Stores that follow a repository: build once, then update with only the changed files re-tokenised.

``update_repo_store(src, out, tokenizer)`` lists the source files (``repo_files``), hashes
each, reuses the ids of every content the store at ``out`` already holds (``repo_cache``:
keyed by sha256, so an unchanged, renamed or copied file is never tokenised again),
tokenises the rest, and indexes the whole stream afresh (indexing runs at millions of
tokens per second; tokenising is the slow part). The result is an ordinary datastore with
one more file (``repo_files.arrow``) and one more manifest section (``repo``), written
into a temp directory and swapped into place, as ``build`` does: a reader holding the old
store keeps working, and a failed update leaves it as it was. Its token stream equals a
fresh build of the same tree, file by file in path order.

Every check that can refuse runs before any file is tokenised: the source must be a
directory, ``out`` must be absent, an empty directory, or a repo store of the same source
root built with the same tokenizer.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrieval_draft.atomic import temp_dir_next_to
from retrieval_draft.errors import EmptyCorpusError, InvalidInputError, TokenizerMismatchError
from retrieval_draft.store.layout import separator_id, token_dtype
from retrieval_draft.store.manifest import read_manifest
from retrieval_draft.store.tokenizer import tokenizer_fingerprint, tokenizer_vocab_size
from retrieval_draft_datastore.builder import finish_store
from retrieval_draft_datastore.encode import BATCH_DOCS, encode_texts
from retrieval_draft_datastore.index import IndexParams
from retrieval_draft_datastore.out_path import check_out
from retrieval_draft_datastore.repo_cache import FileEntry, PreviousStore, load_previous, write_repo_index
from retrieval_draft_datastore.repo_files import SOURCE_GLOBS, SourceText, check_source_root, list_sources, read_source
from retrieval_draft_datastore.sources import SourceOptions

REPO_OPTIONS = SourceOptions(globs=SOURCE_GLOBS)


@dataclass(frozen=True)
class RepoUpdate:
    """What one ``update_repo_store`` call did.

    Attributes:
        store: the store's path. files: source files it now holds.
        changed / added / deleted / unchanged: files by what happened to them since the last update
            (a first build adds every file).
        tokenised: distinct file contents tokenised by this call (the rest reused cached ids).
        tokens: the stream's length, separators included. seconds: wall time of the whole call.
        built: True when ``out`` held no store before this call (a first build), False for an update.
    """

    store: Path
    files: int
    changed: int
    added: int
    deleted: int
    unchanged: int
    tokenised: int
    tokens: int
    seconds: float
    built: bool = False

    def line(self) -> str:
        """The one-line report the CLI prints: ``built ...`` after a first build, ``updated ...`` after."""
        verb = "built" if self.built else "updated"
        return (f"{verb} {self.store}: {self.files} files ({self.changed} changed, {self.added} added, "
                f"{self.deleted} deleted, {self.unchanged} unchanged), {self.tokens} tokens in {self.seconds:.2f} s")


def check_target(out: Path, root: Path) -> dict | None:
    """The checked manifest of the repo store at ``out``, or None when ``out`` is absent or an empty folder.

    Raises InvalidInputError when ``out`` holds anything else (what ``check_out`` refuses for every
    writer, a store built by ``build``, a repo store of another source root), CorruptDatastoreError
    when its manifest is damaged: nothing is replaced that an update could lose.
    """
    out = check_out(out)
    if not out.exists() or not any(out.iterdir()):
        return None
    manifest = read_manifest(out)
    repo = manifest.get("repo")
    if not isinstance(repo, dict):
        raise InvalidInputError(f"--out {out} is a datastore but not a repo store (built by `build`?); "
                                "choose another path")
    if repo.get("root") != str(root):
        raise InvalidInputError(f"--out {out} follows {repo.get('root')}, not {root}; choose another path")
    return manifest


def check_tokenizer(manifest: dict, header: dict, out: Path) -> None:
    """TokenizerMismatchError when the store at ``out`` was built with another tokenizer than the one
    ``header`` (fingerprint, vocab_size) describes."""
    stored = manifest["tokenizer"]
    if stored["fingerprint"] != header["fingerprint"] or stored["vocab_size"] != header["vocab_size"]:
        raise TokenizerMismatchError(f"--out {out} was built with another tokenizer; use that one or another path")


def _tokenise_new(sources: list[SourceText], previous: PreviousStore, tokenizer, vocab_size: int) -> dict:
    """sha256 -> ids of every content in ``sources`` the old store lacks (each distinct content once)."""
    todo = {s.sha256: s.text for s in sources if s.sha256 not in previous.ids}
    hashes, texts = list(todo), list(todo.values())
    fresh = {}
    for at in range(0, len(texts), BATCH_DOCS):
        encoded = encode_texts(tokenizer, texts[at : at + BATCH_DOCS], vocab_size)
        fresh.update(zip(hashes[at : at + BATCH_DOCS], encoded))
    return fresh


def _stream(sources: list[SourceText], ids: dict, dtype: np.dtype) -> tuple[np.ndarray, list[FileEntry]]:
    """The token stream (every file with tokens, in order, each followed by the separator) and
    every file's place in it."""
    sep = np.array([separator_id(dtype)], dtype)
    pieces, entries, at = [], [], 0
    for source in sources:
        file_ids = ids[source.sha256]
        entries.append(FileEntry(source.path, source.sha256, at, int(file_ids.size)))
        if file_ids.size:
            pieces += [file_ids.astype(dtype, copy=False), sep]
            at += int(file_ids.size) + 1
    return (np.concatenate(pieces) if pieces else np.empty(0, dtype)), entries


def _classify(old: dict[str, str], sources: list[SourceText]) -> dict[str, int]:
    """Counts of changed, added, deleted and unchanged files between the old path->hash map and now."""
    now = {s.path: s.sha256 for s in sources}
    kept = [p for p in now if p in old]
    unchanged = sum(old[p] == now[p] for p in kept)
    return {"changed": len(kept) - unchanged, "added": len(now) - len(kept),
            "deleted": len(set(old) - set(now)), "unchanged": unchanged}


def _write(out: Path, tokens: np.ndarray, entries: list[FileEntry], header: dict, params: IndexParams,
           repo: dict) -> dict:
    """Index ``tokens`` with the per-file index into a temp directory and swap it in as ``out``."""
    tmp = temp_dir_next_to(out)
    try:
        repo = {**repo, "files": len(entries), "index": write_repo_index(tmp, entries)}
        return finish_store(tmp, out, tokens, header, params, {"engine": "repo"}, {"repo": repo})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def update_repo_store(src: Path, out: Path, tokenizer, *, options: SourceOptions = REPO_OPTIONS,
                      params: IndexParams = IndexParams()) -> RepoUpdate:
    """Build or update the repo store at ``out`` from the source tree ``src``; see the module docstring.

    Raises InvalidInputError, TokenizerMismatchError, CorruptDatastoreError (all before any
    tokenising), EmptyCorpusError, TokenIdOutOfRangeError; ``out`` is unchanged on any error.
    """
    start = time.perf_counter()
    root, out = check_source_root(Path(src)), Path(out).resolve()
    old = check_target(out, root)
    header = {"vocab_size": tokenizer_vocab_size(tokenizer), "fingerprint": tokenizer_fingerprint(tokenizer)}
    if old is not None:
        check_tokenizer(old, header, out)
    previous = load_previous(out, old) if old is not None else PreviousStore({}, {})
    lister, paths = list_sources(root, options)
    sources = [s for s in (read_source(root, p) for p in paths) if s is not None]
    fresh = _tokenise_new(sources, previous, tokenizer, header["vocab_size"])
    tokens, entries = _stream(sources, {**previous.ids, **fresh}, token_dtype(header["vocab_size"]))
    if tokens.size == 0:
        raise EmptyCorpusError(f"no source file under {root} produced tokens")
    header["documents"] = sum(e.length > 0 for e in entries)
    repo = {"root": str(root), "lister": lister, "globs": list(options.globs), "excludes": list(options.excludes)}
    _write(out, tokens, entries, header, params, repo)
    return RepoUpdate(out, len(entries), **_classify(previous.hashes, sources), tokenised=len(fresh),
                      tokens=int(tokens.size), seconds=time.perf_counter() - start, built=old is None)
