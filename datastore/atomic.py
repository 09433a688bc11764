"""Crash-safe writes: temp file + fsync + os.replace, and directory swaps.

A reader never sees a half-written file (files are renamed into place once
complete) and never has a memory-mapped file rewritten under it (which kills
it with SIGBUS): every write creates a new inode.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by path."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temp path next to ``final``; on success fsync it and rename it to ``final``."""
    final = Path(final)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, final)
        fsync_path(final.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(final: Path, data: bytes) -> None:
    """Write ``data`` to ``final`` atomically."""
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)


def temp_dir_next_to(out: Path) -> Path:
    """A fresh empty directory in ``out``'s parent (same filesystem, so rename is atomic)."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))


def swap_into_place(new_dir: Path, out: Path) -> None:
    """Replace directory ``out`` by the complete directory ``new_dir``.

    Two renames: the previous ``out`` moves aside, ``new_dir`` takes its name,
    then the old one is deleted. A reader opening ``out`` sees either the old
    or the new datastore, never a mix (it may briefly see no directory at all).
    """
    out = Path(out).resolve()
    fsync_path(new_dir)
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rmdir(old)
        os.replace(out, old)
    os.replace(new_dir, out)
    fsync_path(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
