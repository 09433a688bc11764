"""Corpus readers: stream documents (str) from directories, text, JSONL and Parquet,
on local disk or behind a URL (``s3://``, ``gs://``, ``file://``: any filesystem
pyarrow reads, and through fsspec, when installed, the ones it reads).

Memory stays bounded: one file (or one Parquet record batch) at a time.
Order is deterministic: sources in the given order, directory entries sorted.
``plan_files`` lists the files first (so a missing source, or a binary file named as
one, fails before any work); ``file_documents`` reads one of them, which lets a distributed build
hand files to workers in the same order.
"""

from __future__ import annotations

import fnmatch
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from retrieval_draft.errors import EmptyCorpusError, InvalidInputError

BINARY_SNIFF_BYTES = 8192
STRUCTURED_SUFFIXES = (".jsonl", ".parquet")  # read by record; every other file is one document of text


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


@dataclass(frozen=True)
class SourceFile:
    """One file to read: a local path or a URL.

    Attributes:
        location: the path or URL.
        from_directory: found by walking a directory (binary files there are skipped).
        size: bytes, for balancing shards.
    """

    location: str
    from_directory: bool
    size: int = 0


def iter_documents(sources: list[str], options: SourceOptions) -> Iterator[str]:
    """Yield the documents of every source in order. Missing sources raise InvalidInputError
    before any file is read."""
    for file in plan_files(sources, options):
        yield from file_documents(file, options)


def is_url(source: str) -> bool:
    """Whether ``source`` names a filesystem by scheme (``s3://``, ``gs://``, ``file://``, ...)."""
    return "://" in source


def plan_files(sources: list[str], options: SourceOptions) -> list[SourceFile]:
    """Every file of ``sources`` in reading order. Raises InvalidInputError for a missing source
    and for a binary file named as one (``check_named_text``)."""
    files: list[SourceFile] = []
    for source in sources:
        if is_url(source):
            files.extend(_plan_url(source, options))
            continue
        path = Path(source)
        if path.is_dir():
            files.extend(SourceFile(str(f), True, f.stat().st_size) for f in _walk(path, options))
        elif path.is_file():
            files.append(SourceFile(str(path), False, path.stat().st_size))
        else:
            raise InvalidInputError(f"source not found: {source}")
    for file in files:
        if not file.from_directory:
            check_named_text(file.location)
    return files


def is_binary(head: bytes) -> bool:
    """Whether a file that begins with ``head`` is binary: a NUL byte in its first ``BINARY_SNIFF_BYTES``.
    A binary file found in a folder is skipped; one named as a source is refused."""
    return b"\x00" in head[:BINARY_SNIFF_BYTES]


def check_named_text(location: str) -> None:
    """InvalidInputError when the file named as a source at ``location`` is binary (``is_binary``);
    .jsonl and .parquet files are read by record and pass."""
    if _suffix(location) in STRUCTURED_SUFFIXES:
        return
    with _open(location) as handle:
        head = handle.read(BINARY_SNIFF_BYTES)
    if is_binary(head):
        raise InvalidInputError(f"source {location} is not a text file (a NUL byte in its first "
                                f"{BINARY_SNIFF_BYTES} bytes); name text, .jsonl or .parquet files")


def _suffix(location: str) -> str:
    """The lower-case extension of the file at a path or URL ("" when none)."""
    return Path(location.rsplit("/", 1)[-1]).suffix.lower()


def empty_corpus(sources: list[str], options: SourceOptions) -> EmptyCorpusError:
    """The error for ``sources`` that produced no token, naming them and the file patterns
    that chose files inside folders (``--glob``, ``--exclude``)."""
    chosen = f"glob {', '.join(map(repr, options.globs))}"
    if options.excludes:
        chosen += f", exclude {', '.join(map(repr, options.excludes))}"
    return EmptyCorpusError(f"the corpus produced no tokens: no text in {', '.join(map(str, sources))} ({chosen})")


def path_selected(parts: tuple[str, ...], options: SourceOptions) -> bool:
    """Whether a file at relative path ``parts`` (below a directory source) is read."""
    if any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in options.excludes):
        return False
    return any(fnmatch.fnmatch(parts[-1], pattern) for pattern in options.globs)


def _walk(root: Path, options: SourceOptions) -> Iterator[Path]:
    """Selected files under ``root``, sorted by path."""
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        if path_selected(file.relative_to(root).parts, options):
            yield file


def _filesystem(url: str):
    """(pyarrow filesystem, path inside it) of a URL; fsspec serves schemes pyarrow lacks."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(url)
    except (pa.ArrowException, ValueError) as arrow_error:
        try:
            import fsspec
        except ImportError:
            raise InvalidInputError(f"no filesystem for {url} ({arrow_error})") from None
        fs, path = fsspec.core.url_to_fs(url)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _plan_url(url: str, options: SourceOptions) -> list[SourceFile]:
    """The files under a URL: a directory walked like a local one, or a single file."""
    import pyarrow.fs as pafs

    fs, root = _filesystem(url)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        return [SourceFile(url, False, int(info.size or 0))]
    if info.type != pafs.FileType.Directory:
        raise InvalidInputError(f"source not found: {url}")
    base, root = url.rstrip("/"), root.rstrip("/")
    found = []
    for entry in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        parts = tuple(p for p in entry.path[len(root) :].split("/") if p)
        if entry.type == pafs.FileType.File and path_selected(parts, options):
            found.append(SourceFile("/".join((base, *parts)), True, int(entry.size or 0)))
    return sorted(found, key=lambda f: f.location)


def _open(location: str):
    """A binary file object for a local path or a URL."""
    if not is_url(location):
        return open(location, "rb")
    fs, path = _filesystem(location)
    return fs.open_input_file(path)


def file_documents(file: SourceFile, options: SourceOptions) -> Iterator[str]:
    """Documents of one file, chosen by extension: .jsonl, .parquet, else the whole file."""
    suffix = _suffix(file.location)
    with _open(file.location) as handle:
        if suffix == ".jsonl":
            yield from _jsonl_documents(handle, file.location, options.field)
        elif suffix == ".parquet":
            yield from _parquet_documents(handle, file.location, options.column, options.parquet_batch_rows)
        else:
            text = _read_text(handle.read(), skip_binary=file.from_directory)
            if text:
                yield text


def _read_text(data: bytes, *, skip_binary: bool) -> str | None:
    """File contents as text (undecodable bytes replaced); binary files in directories are skipped."""
    if skip_binary and is_binary(data):
        return None
    return data.decode("utf-8", errors="replace")


def _jsonl_documents(binary, path: str, field: str) -> Iterator[str]:
    """One document per JSON line (its ``field`` string); blank lines are skipped."""
    handle = io.TextIOWrapper(binary, encoding="utf-8", errors="replace")
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


def _parquet_documents(handle, path: str, column: str, batch_rows: int) -> Iterator[str]:
    """One document per non-null row of ``column``, read in record batches."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(handle)
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError variants
        raise InvalidInputError(f"{path}: not a readable Parquet file ({exc})") from exc
    if column not in parquet.schema_arrow.names:
        raise InvalidInputError(f"{path}: no column {column!r} (has {parquet.schema_arrow.names})")
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=[column]):
        for text in batch.column(0).to_pylist():
            if isinstance(text, str) and text:
                yield text
