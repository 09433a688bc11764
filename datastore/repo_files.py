"""The source files of a repository: which files a repo store reads, and their bytes.

Inside a git work tree the list is git's own (``git ls-files``: tracked files plus
untracked ones that are not ignored), so ``.venv``, build output and anything else
``.gitignore`` names never enter the store. Elsewhere a directory walk skips hidden
and build folders. Either way only files matching the globs (default: common source
and text formats) and no exclude pattern are kept, symbolic links and binary files
(a NUL byte in the first 8 KiB) are skipped, and the order is the ``build`` command's:
sorted by path components.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from retrieval_draft.errors import InvalidInputError
from retrieval_draft_datastore.sources import BINARY_SNIFF_BYTES, SourceOptions, path_selected

SOURCE_GLOBS = (
    "*.py", "*.pyi", "*.pyx", "*.md", "*.rst", "*.txt", "*.toml", "*.cfg", "*.ini", "*.yaml", "*.yml",
    "*.js", "*.jsx", "*.mjs", "*.ts", "*.tsx", "*.c", "*.h", "*.cc", "*.cpp", "*.hpp", "*.cu", "*.rs",
    "*.go", "*.java", "*.kt", "*.scala", "*.rb", "*.php", "*.cs", "*.swift", "*.sh", "*.sql", "*.html",
    "*.css", "*.proto", "Makefile", "Dockerfile",
)
WALK_EXCLUDES = (".*", "__pycache__", "build", "dist", "node_modules", "target", "*.egg-info", "venv")


@dataclass(frozen=True)
class SourceText:
    """One source file read for a repo store.

    Attributes:
        path: relative to the source root, '/'-separated.
        sha256: hex digest of the file's bytes.
        text: the bytes decoded as UTF-8 (undecodable bytes replaced), as ``build`` reads them.
    """

    path: str
    sha256: str
    text: str


def check_source_root(src: Path) -> Path:
    """``src`` resolved; InvalidInputError when it is missing or not a directory."""
    if not src.exists():
        raise InvalidInputError(f"source not found: {src}")
    if not src.is_dir():
        raise InvalidInputError(f"source is not a directory: {src}")
    return src.resolve()


def in_git_work_tree(root: Path) -> bool:
    """Whether ``root`` lies inside a git work tree (False when git is not installed)."""
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                              capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return False
    return done.returncode == 0 and done.stdout.strip() == "true"


def _git_paths(root: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files under ``root``, relative to it."""
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise InvalidInputError(f"git ls-files failed in {root}: {done.stderr.decode(errors='replace').strip()}")
    return sorted({p for p in done.stdout.decode("utf-8", errors="surrogateescape").split("\0") if p})


def _walk_paths(root: Path, excludes: tuple[str, ...]) -> list[str]:
    """Files under ``root`` (relative, '/'-separated), not descending into excluded folders."""
    folders = SourceOptions(globs=("*",), excludes=excludes)
    found = []
    for folder, dirs, files in os.walk(root):
        base = Path(folder).relative_to(root).parts
        dirs[:] = [d for d in dirs if path_selected((*base, d), folders)]
        found.extend("/".join((*base, name)) for name in files)
    return found


def list_sources(root: Path, options: SourceOptions) -> tuple[str, list[str]]:
    """(lister, paths): ``"git"`` or ``"walk"``, and the selected regular files under ``root``
    (relative, '/'-separated) in reading order. ``options.excludes`` apply in both modes; the
    walk also skips ``WALK_EXCLUDES``."""
    if in_git_work_tree(root):
        lister, paths = "git", _git_paths(root)
    else:
        lister, paths = "walk", _walk_paths(root, WALK_EXCLUDES + options.excludes)
    kept = [p for p in paths if path_selected(tuple(p.split("/")), options) and _regular_file(root / p)]
    return lister, sorted(kept, key=lambda p: tuple(p.split("/")))


def _regular_file(path: Path) -> bool:
    """A file that is no symbolic link (links could lead out of the tree or read a file twice)."""
    return not path.is_symlink() and path.is_file()


def read_source(root: Path, path: str) -> SourceText | None:
    """The file at ``root / path`` with its hash, or None for a binary file."""
    data = (root / path).read_bytes()
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        return None
    return SourceText(path, hashlib.sha256(data).hexdigest(), data.decode("utf-8", errors="replace"))
