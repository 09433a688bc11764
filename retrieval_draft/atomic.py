"""Crash-safe writes: temp file + fsync + os.replace, and directory swaps.

A reader never sees a half-written file (files are renamed into place once
complete) and never has a memory-mapped file rewritten under it (which kills
it with SIGBUS): every write creates a new inode.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
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
    """Yield a temp path next to ``final``; on success fsync it and rename it to ``final``.

    The temp file is created with the permissions a plain ``open`` would give
    (0o666 less the umask), so the renamed file is as readable as any other.
    """
    final = Path(final)
    tmp = _create_fresh(final.parent, f".{final.name}.", ".tmp", directory=False)
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
    return _create_fresh(out.parent, f".{out.name}.building-", "", directory=True)


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
        old = _create_fresh(out.parent, f".{out.name}.old-", "", directory=True)
        os.rmdir(old)
        os.replace(out, old)
    os.replace(new_dir, out)
    fsync_path(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _create_fresh(parent: Path, prefix: str, suffix: str, directory: bool) -> Path:
    """Create a new, uniquely named empty file or directory in ``parent``.

    Unlike ``tempfile.mkstemp``/``mkdtemp`` (always 0o600/0o700), the kernel
    applies the process umask to 0o666/0o777, as for any file the user creates,
    so a datastore built by one account can be shared with others.
    """
    for _ in range(100):
        path = Path(parent) / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            if directory:
                os.mkdir(path, 0o777)
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {prefix}* in {parent}")
