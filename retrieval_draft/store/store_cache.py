"""Opened datastores, kept for reuse while their directory is unchanged.

Opening a large store verifies the sha256 of every file before anything is
parsed (2.85 s cold, 1.24 s warm for an 898 MB store), far more than a
128-token answer takes. ``StoreCache`` pays that once per store *identity*:
the resolved path plus the device, inode, size and modification time of the
manifest and of every data file. Builds replace a store by renaming a
complete directory into place, so a rebuild gives every file a new inode and
the next call opens (and verifies) the new store; a caller still holding the
old one keeps reading its memory-mapped files, which the rename does not
touch. A file changed in place (which no build does) changes its mtime and
ctime and is verified again too. Checking the identity costs six ``stat``
calls, ~20 us (six per shard more for a sharded store, whose every shard file
is part of its identity, so a damaged shard is verified again).

Across processes: after a full verification the identity is recorded in the
user cache directory (``cache_dir``, ``verified-stores/``). A new process that
finds the same identity (inode, size, mtime and ctime of every file; ctime
cannot be set back by hand) opens the store without re-reading its bytes
(``open_datastore(verify=False)``: manifest checksum, sizes, schemas and
lengths only), which for an 898 MB store saves about 1-3 s. A missing,
damaged or foreign record means a full verification.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from retrieval_draft.cache_dir import cache_file, write_cache_json
from retrieval_draft.errors import CorruptDatastoreError
from retrieval_draft.store.layout import DATA_FILES, MANIFEST, SHARD_PREFIX
from retrieval_draft.store.manifest import check_store_folder

if TYPE_CHECKING:
    from retrieval_draft.store.reader import Datastore
    from retrieval_draft.store.sharded import ShardedDatastore


@dataclass(frozen=True)
class StoreIdentity:
    """What tells one build of a store from another at the same path.

    ``files``: per file (manifest first, then ``DATA_FILES``, then those of each
    shard of a sharded store) its (name, device, inode, size, mtime_ns, ctime_ns),
    or None for a missing data file.
    """

    path: str
    files: tuple


def _identity_names(resolved: str) -> list[str]:
    """Files whose stats make a store's identity: the manifest and data files, and for a sharded
    store the same of every shard directory (``shard-*``) under it."""
    names = [MANIFEST, *DATA_FILES]
    try:
        shards = sorted(name for name in os.listdir(resolved) if name.startswith(SHARD_PREFIX))
    except OSError:
        shards = []
    for shard in shards:
        names.extend(os.path.join(shard, name) for name in (MANIFEST, *DATA_FILES))
    return names


def store_identity(path: str | os.PathLike) -> StoreIdentity:
    """The identity of the store at ``path``; DatastoreNotFoundError when no store is there
    (``check_store_folder``), CorruptDatastoreError when its manifest cannot be read."""
    check_store_folder(path)
    resolved = os.path.realpath(path)
    stats = []
    for name in _identity_names(resolved):
        try:
            st = os.stat(os.path.join(resolved, name))
        except OSError as error:
            if name == MANIFEST:
                raise CorruptDatastoreError(f"{path}: unreadable manifest ({error.strerror})") from error
            stats.append(None)  # open_datastore names the missing file
            continue
        stats.append((name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return StoreIdentity(resolved, tuple(stats))


def _record_path(identity: StoreIdentity) -> Path:
    return cache_file("verified-stores", identity.path)


def _record_body(identity: StoreIdentity) -> dict:
    return {"path": identity.path, "files": [list(f) if f is not None else None for f in identity.files]}


def was_verified(identity: StoreIdentity) -> bool:
    """Whether a record says this exact identity passed a full verification."""
    try:
        return json.loads(_record_path(identity).read_bytes()) == _record_body(identity)
    except (OSError, ValueError):
        return False


def record_verified(identity: StoreIdentity) -> None:
    """Record a fully verified identity (atomically; an unwritable cache is skipped)."""
    write_cache_json(_record_path(identity), _record_body(identity))


class StoreCache:
    """Verified, memory-mapped datastores by path, one per identity.

    Holds at most one open store per resolved path: when the directory
    changes, the old entry is dropped (its arrays stay valid for whoever
    still holds them). Thread-safe: concurrent first calls open a store once.
    """

    def __init__(self) -> None:
        self._stores: dict[str, tuple[StoreIdentity, Datastore]] = {}
        self._lock = threading.Lock()

    def open(self, path: str | os.PathLike) -> "Datastore | ShardedDatastore":
        """The store at ``path``, opened and verified on first use or after a rebuild.

        Raises what ``open_datastore`` raises (CorruptDatastoreError, ...); a
        failed open caches nothing.
        """
        from retrieval_draft.store.opening import open_datastore

        identity = store_identity(path)
        with self._lock:
            held = self._stores.get(identity.path)
            if held is not None and held[0] == identity:
                return held[1]
            known = was_verified(identity)
            store = open_datastore(Path(identity.path), verify=not known)
            # A rebuild between the stat and the open would pair the new store with
            # the old identity; re-stat so that such a store is re-opened next call.
            if store_identity(path) == identity:
                self._stores[identity.path] = (identity, store)
                if not known:
                    record_verified(identity)
            return store

    def __len__(self) -> int:
        return len(self._stores)

    def clear(self) -> None:
        """Forget every store (callers keep the ones they hold)."""
        with self._lock:
            self._stores.clear()
