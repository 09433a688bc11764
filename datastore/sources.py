"""Corpus readers: stream documents (str) from directories, text, JSONL and Parquet.

Memory stays bounded: one file (or one Parquet record batch) at a time.
Order is deterministic: sources in the given order, directory entries sorted.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from retrieval_draft.errors import InvalidInputError

BINARY_SNIFF_BYTES = 8192


@dataclass(frozen=True)
class SourceOptions:
    """How to read sources.

    Attributes:
        globs: file name patterns selecting files inside directories.
        excludes: patterns matched against each path component below a
            directory source (e.g. ``site-packages``, ``test*``): a match skips
            that file or that whole subtree.
        field: JSONL object key holding the document text.
        column: Parquet column holding the document text.
        parquet_batch_rows: rows per Parquet record batch read.
    """

    globs: tuple[str, ...] = ("*",)
    excludes: tuple[str, ...] = ()
    field: str = "text"
    column: str = "text"
    parquet_batch_rows: int = 1024


def iter_documents(sources: list[str], options: SourceOptions) -> Iterator[str]:
    """Yield the documents of every source in order. Missing sources raise InvalidInputError."""
    for source in sources:
        path = Path(source)
        if path.is_dir():
            for file in _walk(path, options.globs, options.excludes):
                yield from _file_documents(file, options, from_directory=True)
        elif path.is_file():
            yield from _file_documents(path, options, from_directory=False)
        else:
            raise InvalidInputError(f"source not found: {source}")


def _walk(root: Path, globs: tuple[str, ...], excludes: tuple[str, ...] = ()) -> Iterator[Path]:
    """Files under ``root`` whose name matches one of ``globs`` and no part of whose
    path below ``root`` matches one of ``excludes``, sorted by path."""
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        parts = file.relative_to(root).parts
        if any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in excludes):
            continue
        if any(fnmatch.fnmatch(file.name, pattern) for pattern in globs):
            yield file


def _file_documents(path: Path, options: SourceOptions, *, from_directory: bool) -> Iterator[str]:
    """Documents of one file, chosen by extension: .jsonl, .parquet, else the whole file."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from _jsonl_documents(path, options.field)
    elif suffix == ".parquet":
        yield from _parquet_documents(path, options.column, options.parquet_batch_rows)
    else:
        text = _read_text(path, skip_binary=from_directory)
        if text:
            yield text


def _read_text(path: Path, *, skip_binary: bool) -> str | None:
    """File contents as text (undecodable bytes replaced); binary files in directories are skipped."""
    data = path.read_bytes()
    if skip_binary and b"\x00" in data[:BINARY_SNIFF_BYTES]:
        return None
    return data.decode("utf-8", errors="replace")


def _jsonl_documents(path: Path, field: str) -> Iterator[str]:
    """One document per JSON line (its ``field`` string); blank lines are skipped."""
    with path.open("r", encoding="utf-8", errors="replace") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidInputError(f"{path}:{line_no}: invalid JSON ({exc.msg})") from exc
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise InvalidInputError(f"{path}:{line_no}: no string field {field!r}")
            if record[field]:
                yield record[field]


def _parquet_documents(path: Path, column: str, batch_rows: int) -> Iterator[str]:
    """One document per non-null row of ``column``, read in record batches."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError variants
        raise InvalidInputError(f"{path}: not a readable Parquet file ({exc})") from exc
    if column not in parquet.schema_arrow.names:
        raise InvalidInputError(f"{path}: no column {column!r} (has {parquet.schema_arrow.names})")
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=[column]):
        for text in batch.column(0).to_pylist():
            if isinstance(text, str) and text:
                yield text
