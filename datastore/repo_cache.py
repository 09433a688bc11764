"""The per-file token cache of a repo store: which stream slice holds which file's tokens.

A repo store keeps one side file, ``repo_files.arrow``, with one row per source file:
``path`` (relative, '/'-separated), ``sha256`` (hex of the file's bytes), ``start`` and
``length`` (uint64: the file's ids are ``tokens[start : start + length]`` of the store's
own ``tokens.arrow``, the separator after them excluded; length 0 for a file with no
tokens). The token ids themselves are not stored twice: the stream is the cache.

The manifest's ``repo`` section records the source root and this file's sha256 and size,
so the manifest's self checksum covers it; ``load_previous`` checks both files it reads
(``tokens.arrow`` against ``files``, the side file against ``repo.index``) before parsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from retrieval_draft.errors import CorruptDatastoreError
from retrieval_draft.store.arrow_io import read_table, write_table
from retrieval_draft.store.layout import TOKENS
from retrieval_draft.store.manifest import file_sha256

REPO_INDEX = "repo_files.arrow"


@dataclass(frozen=True)
class FileEntry:
    """One source file's place in the stream: ids are ``tokens[start : start + length]``."""

    path: str
    sha256: str
    start: int
    length: int


@dataclass(frozen=True)
class PreviousStore:
    """What an update reuses from the store it replaces.

    Attributes:
        hashes: path -> sha256 of every file the old store holds.
        ids: sha256 -> that content's ids ((n,) array view of the old stream), for every file.
    """

    hashes: dict[str, str]
    ids: dict[str, np.ndarray]


def write_repo_index(directory: Path, entries: list[FileEntry]) -> dict:
    """Write ``repo_files.arrow`` into ``directory`` atomically; returns its {name, sha256, bytes}."""
    path = directory / REPO_INDEX
    write_table(path, {
        "path": np.array([e.path for e in entries], dtype=object),
        "sha256": np.array([e.sha256 for e in entries], dtype=object),
        "start": np.array([e.start for e in entries], dtype=np.uint64),
        "length": np.array([e.length for e in entries], dtype=np.uint64),
    })
    return {"name": REPO_INDEX, "sha256": file_sha256(path), "bytes": path.stat().st_size}


def _checked(path: Path, record: dict) -> Path:
    """``path`` after checking its size and sha256 against ``record``; CorruptDatastoreError otherwise."""
    if not path.is_file() or path.stat().st_size != record.get("bytes") or file_sha256(path) != record.get("sha256"):
        raise CorruptDatastoreError(f"{path.name}: missing or sha256 mismatch (remove the store and build it again)")
    return path


def _read_entries(path: Path) -> list[FileEntry]:
    """The rows of a checked ``repo_files.arrow``."""
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
        table.validate(full=True)
        rows = table.select(["path", "sha256", "start", "length"]).to_pylist()
    except (pa.ArrowException, KeyError, OSError, ValueError) as exc:
        raise CorruptDatastoreError(f"{path.name}: unreadable ({exc})".splitlines()[0]) from exc
    return [FileEntry(r["path"], r["sha256"], int(r["start"]), int(r["length"])) for r in rows]


def load_previous(store: Path, manifest: dict) -> PreviousStore:
    """The files and token ids of the repo store at ``store`` (its checked ``manifest``).

    Reads only ``tokens.arrow`` and ``repo_files.arrow``, each after its sha256 matched.
    Raises CorruptDatastoreError when either fails its check or a slice lies outside the stream.
    """
    tokens_path = _checked(store / TOKENS, manifest["files"][TOKENS])
    entries = _read_entries(_checked(store / REPO_INDEX, manifest["repo"]["index"]))
    dtype = pa.from_numpy_dtype(np.dtype(manifest["storage"]["dtype"]))
    tokens = read_table(tokens_path, {"token": dtype}, full=False)["token"]
    if any(e.start + e.length > tokens.size for e in entries):
        raise CorruptDatastoreError(f"{REPO_INDEX}: a file's slice lies outside the token stream")
    return PreviousStore(hashes={e.path: e.sha256 for e in entries},
                         ids={e.sha256: tokens[e.start : e.start + e.length] for e in entries})
