"""Open a sharded store (format 4): one store made of shards, each a format-3 store.

The top-level manifest lists the shards (directory, tokens, documents, sha256
of the shard's manifest) and the store's n-gram table (``ngram.arrow``, the
whole corpus's table) and rare-context filter (``rare_contexts.arrow``):
``layout`` describes the directory. Opening checks the
top manifest, its table, then every shard with ``reader.open_flat``: each
shard's own manifest must have the digest the top manifest records (so a shard
swapped for another store is caught), the same tokenizer, storage and params.
Any failure raises one typed line naming the shard (``shard-00003: ...``) and
nothing is returned, so no caller ever drafts from part of a store.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa

from retrieval_draft.errors import CorruptDatastoreError, DatastoreError
from retrieval_draft.store.arrow_io import read_table
from retrieval_draft.store.layout import NGRAM, RARE_FILTER, SHARD_TABLE_MIN, SHARDED_FILES, token_dtype
from retrieval_draft.store.rare_filter import BLOCK_WORDS
from retrieval_draft.store.manifest import ManifestFields, check_sizes, manifest_digest, verify_files
from retrieval_draft.store.reader import Datastore, NgramTable, check_ids, check_storage, ngram_table, open_flat


@dataclass(frozen=True)
class ShardedDatastore(ManifestFields):
    """A validated sharded store: its manifest, the corpus's n-gram table and the opened shards.

    ``shards``: one ``Datastore`` per shard in stream order (shard i holds the documents after
    those of shard i - 1). Drafters read ``ngrams`` and ``kernel_arrays`` as they do a flat store's.
    """

    path: Path
    manifest: dict
    ngrams: NgramTable
    shards: tuple[Datastore, ...]

    @property
    def tokens_total(self) -> int:
        return int(self.manifest["stats"]["tokens"])

    @cached_property
    def kernel_arrays(self) -> tuple:
        """The query kernels' view of the shards (``shard_arrays``), built once per store."""
        from retrieval_draft.store.shard_arrays import shard_arrays

        return shard_arrays(self.shards, self.separator, self.vocab_size)


def _check_top(manifest: dict) -> tuple[np.dtype, list[dict]]:
    """The stream dtype and the shard records, after checking the top manifest's fields."""
    try:
        vocab_size = int(manifest["tokenizer"]["vocab_size"])
        dtype = token_dtype(vocab_size)
        storage, shards = manifest["storage"], manifest["shards"]
        int(manifest["params"]["max_order"]), int(manifest["params"]["top_k"]), int(manifest["stats"]["tokens"])
        names = [str(s["dir"]) for s in shards]
        [(int(s["tokens"]), str(s["manifest_sha256"])) for s in shards]
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptDatastoreError(f"manifest is missing or has a bad field ({exc})") from exc
    check_storage(storage, vocab_size)
    if not shards or any("/" in n or n.startswith(".") for n in names) or len(set(names)) != len(names):
        raise CorruptDatastoreError("manifest lists no shards, or a bad or repeated shard directory")
    if sum(int(s["tokens"]) for s in shards) != int(manifest["stats"]["tokens"]):
        raise CorruptDatastoreError("manifest shard token counts do not add up to its total")
    return dtype, shards


def _open_shard(directory: Path, record: dict, top: dict, verify: bool) -> Datastore:
    """Shard ``record`` of the store at ``directory``, checked against the top manifest ``top``."""
    name = record["dir"]
    try:
        if manifest_digest(directory / name) != record["manifest_sha256"]:
            raise CorruptDatastoreError("manifest.json differs from the one the store lists")
        shard = open_flat(directory / name, verify=verify)
    except OSError as exc:
        raise CorruptDatastoreError(f"shard {name}: missing or unreadable ({exc.strerror})") from exc
    except DatastoreError as exc:
        raise type(exc)(f"shard {name}: {exc}") from exc
    if not isinstance(shard, Datastore):
        raise CorruptDatastoreError(f"shard {name}: is itself a sharded store")
    same = {key: top[key] for key in ("tokenizer",)} == {key: shard.manifest[key] for key in ("tokenizer",)}
    params = dict(shard.params, table_min_total=top["params"].get("table_min_total"))
    if not same or params != top["params"] or shard.params.get("table_min_total") != SHARD_TABLE_MIN:
        raise CorruptDatastoreError(f"shard {name}: tokenizer or build parameters differ from the store's")
    if shard.tokens.size != int(record["tokens"]):
        raise CorruptDatastoreError(f"shard {name}: {shard.tokens.size} tokens, the store lists {record['tokens']}")
    return shard


def _rare_filters(directory: Path, manifest: dict, shards: int, verify: bool) -> dict:
    """The shards' rare-context filters: ``rare_filter`` words and ``rare_offsets`` (S + 1,)."""
    words = read_table(directory / RARE_FILTER, {"word": pa.uint64()}, full=verify)["word"]
    try:
        sizes = [int(w) for w in manifest["storage"]["rare_filter_words"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptDatastoreError(f"manifest is missing or has a bad field ({exc})") from exc
    if len(sizes) != shards or min(sizes) < 1 or any(w % BLOCK_WORDS for w in sizes) or sum(sizes) != words.size:
        raise CorruptDatastoreError(f"{RARE_FILTER}: {words.size} words do not match the shards' filters")
    return {"rare_filter": words, "rare_offsets": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)}


def open_sharded(directory: Path, manifest: dict, *, verify: bool = True) -> ShardedDatastore:
    """Open the sharded store at ``directory`` whose manifest (already read and self-checked) is
    ``manifest``; ``verify`` as ``reader.open_flat`` takes it, for the table and every shard.

    Raises CorruptDatastoreError, UnknownFormatVersionError, TokenIdOutOfRangeError (one line,
    naming the shard when a shard is at fault).
    """
    directory = Path(directory)
    dtype, records = _check_top(manifest)
    if verify:
        verify_files(directory, manifest, SHARDED_FILES)
    else:
        check_sizes(directory, manifest, SHARDED_FILES)
    table = replace(ngram_table(directory, dtype, manifest, full=verify),
                    **_rare_filters(directory, manifest, len(records), verify))
    if verify:
        check_ids(NGRAM, table.context, int(manifest["tokenizer"]["vocab_size"]), None)
        check_ids(NGRAM, table.next, int(manifest["tokenizer"]["vocab_size"]), None)
    shards = tuple(_open_shard(directory, record, manifest, verify) for record in records)
    return ShardedDatastore(directory, manifest, table, shards)
