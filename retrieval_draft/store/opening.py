"""Opening a datastore directory of either kind: one index (``reader.open_flat``) or shards (``sharded``)."""

from __future__ import annotations

from pathlib import Path

from retrieval_draft.store.layout import SHARDED_VERSION
from retrieval_draft.store.manifest import read_manifest
from retrieval_draft.store.reader import Datastore, open_flat
from retrieval_draft.store.sharded import ShardedDatastore, open_sharded


def open_datastore(path: str | Path, *, verify: bool = True) -> Datastore | ShardedDatastore:
    """Open and validate the datastore at ``path``: a store made of shards (``sharded.open_sharded``)
    or one index (``reader.open_flat``); ``verify`` as ``open_flat`` takes it.

    Raises CorruptDatastoreError, UnknownFormatVersionError, TokenIdOutOfRangeError.
    """
    directory = Path(path)
    manifest = read_manifest(directory)
    if manifest["format_version"] == SHARDED_VERSION:
        return open_sharded(directory, manifest, verify=verify)
    return open_flat(directory, manifest, verify=verify)
