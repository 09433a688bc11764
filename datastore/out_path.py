"""Where a store may be written: the one rule every command that writes a store follows.

``--out`` may name a path that does not exist yet, an empty folder, or a datastore,
which the new store replaces atomically (``retrieval_draft.atomic.swap_into_place``).
Anything else belongs to the user and is refused before any work, with one
``InvalidInputError`` line saying what is there: a file, a folder holding other files,
a datastore with other files beside its own, a path inside a datastore (its
``manifest.json``, a shard, a new folder in it), the current directory or a folder
holding it (moving that aside would pull the folder from under the shell).

Every writer (``build``, ``merge``, ``repo``, the sharded and Ray builds) calls
``check_out`` before its first expensive step, and ``builder.publish`` calls it
again just before the swap, so no store replaces what appeared at ``--out`` during
the build.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from retrieval_draft.errors import InvalidInputError
from retrieval_draft.store.layout import DATA_FILES, MANIFEST, RARE_FILTER, SHARD_PREFIX
from retrieval_draft_datastore.repo_cache import REPO_INDEX

STORE_FILES = frozenset({MANIFEST, *DATA_FILES, RARE_FILTER, REPO_INDEX})
SHARD_DIR = re.compile(rf"{re.escape(SHARD_PREFIX)}\d{{5}}")
MANIFEST_KEYS = ("format_version", "tokenizer", "files")  # what every datastore manifest holds
MAX_MANIFEST_BYTES = 64 << 20  # a manifest.json larger than this is nobody's datastore manifest


def check_out(out: str | Path) -> Path:
    """The resolved ``out`` when a store may be written there (see the module docstring);
    InvalidInputError otherwise. Reads only directory listings and manifests: no data file."""
    out = Path(out).resolve()
    cwd = Path.cwd().resolve()
    if out == cwd:
        raise InvalidInputError(f"--out {out} is the current directory; choose a new folder for the store")
    if out in cwd.parents:
        raise InvalidInputError(f"--out {out} holds the current directory; choose a new folder for the store")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise InvalidInputError(f"--out {out}: {parent} is a file, not a folder")
        if is_store(parent):
            raise InvalidInputError(f"--out {out} is inside the datastore {parent}; choose a path outside it")
    if not out.exists():
        return out
    if not out.is_dir():
        raise InvalidInputError(f"--out {out} is a file, not a datastore; choose a folder path")
    names = sorted(entry.name for entry in out.iterdir())
    if not names:
        return out
    if not _store_manifest(out):
        raise InvalidInputError(f"--out {out} is not a datastore: a folder holding {_listing(names)}; "
                                "choose a new or empty folder, or a datastore to replace")
    foreign = [name for name in names if not _store_entry(out / name)]
    if foreign:
        raise InvalidInputError(f"--out {out} is a datastore that also holds {_listing(foreign)}; "
                                "move them out or choose another path")
    return out


def is_store(directory: Path) -> bool:
    """Whether ``directory`` holds a datastore's manifest (checksums and data files not checked)."""
    return (Path(directory) / MANIFEST).is_file() and _store_manifest(Path(directory))


def _store_manifest(directory: Path) -> bool:
    """Whether ``directory``/manifest.json parses as a JSON object with a datastore manifest's keys."""
    path = directory / MANIFEST
    try:
        if not path.is_file() or path.stat().st_size > MAX_MANIFEST_BYTES:
            return False
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and all(key in body for key in MANIFEST_KEYS)


def _store_entry(path: Path) -> bool:
    """Whether ``path`` (an entry of a store's folder) is one a builder writes."""
    if SHARD_DIR.fullmatch(path.name):
        return path.is_dir()
    return path.name in STORE_FILES and path.is_file()


def _listing(names: list[str], shown: int = 3) -> str:
    """'a, b, c' or 'a, b, c and 4 more'."""
    head = ", ".join(names[:shown])
    return head if len(names) <= shown else f"{head} and {len(names) - shown} more"
