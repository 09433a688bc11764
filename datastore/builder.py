"""Build and merge datastores, atomically.

Everything is written into a temp directory next to ``--out`` and renamed
into place only when complete, so a failed build leaves the previous
datastore untouched and a reader never sees a half-written one.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np

from retrieval_draft.atomic import swap_into_place, temp_dir_next_to
from retrieval_draft.store.store_cache import record_verified, store_identity
from retrieval_draft.errors import InvalidInputError, TokenizerMismatchError
from retrieval_draft.store.layout import FORMAT_VERSION, separator_id, token_dtype
from retrieval_draft.store.manifest import write_manifest
from retrieval_draft.store.opening import open_datastore
from retrieval_draft.store.sharded import ShardedDatastore
from retrieval_draft.store.suffix_trie import key_width
from retrieval_draft.store.tokenizer import tokenizer_fingerprint, tokenizer_vocab_size
from retrieval_draft_datastore.encode import encode_corpus
from retrieval_draft_datastore.index import IndexParams, write_index
from retrieval_draft_datastore.out_path import check_out
from retrieval_draft_datastore.sources import SourceOptions, empty_corpus, iter_documents

SPOOL = "tokens.spool"


def store_manifest(tmp: Path, tokens: np.ndarray, header: dict, params: IndexParams, index_stats: dict,
                   extra: dict, sections: dict | None = None) -> dict:
    """Write the manifest of the data files in ``tmp``; ``header`` holds vocab_size, fingerprint, documents.

    ``extra`` joins ``stats``; ``sections`` are more top-level keys (a repo store's ``repo``),
    covered by the manifest's self checksum like every other key.
    """
    vocab_size = header["vocab_size"]
    index_stats = dict(index_stats)
    storage = {"dtype": tokens.dtype.name, "separator_id": separator_id(tokens.dtype),
               "trie_key_width": key_width(vocab_size), "count_dtype": index_stats.pop("count_dtype"),
               "position_bits": index_stats.pop("position_bits")}
    body = {
        "format_version": FORMAT_VERSION,
        "tokenizer": {"fingerprint": header["fingerprint"], "vocab_size": vocab_size},
        "storage": storage,
        "params": params.to_dict(),
        "stats": {"documents": header["documents"], "tokens": int(tokens.size), **index_stats, **extra},
        **(sections or {}),
    }
    return write_manifest(tmp, body)


def publish(tmp: Path, out: Path) -> None:
    """Swap the finished store in ``tmp`` into ``out`` and record it as verified in the user cache.

    The builder wrote every file from checked ids and computed the manifest's
    checksums from the files themselves, so the first ``datastore=PATH`` call
    after a build need not hash them again; the record is keyed by the files'
    inodes, sizes and times (``store_cache``), so any later change is verified. ``out`` is
    checked again (``check_out``): nothing that appeared there during the build is replaced.
    """
    swap_into_place(tmp, check_out(out))
    record_verified(store_identity(out))


def finish_store(tmp: Path, out: Path, tokens: np.ndarray, header: dict, params: IndexParams, extra: dict,
                 sections: dict | None = None) -> dict:
    """Index ``tokens`` into ``tmp``, write the manifest (``store_manifest``), publish ``tmp`` as ``out``;
    returns the manifest."""
    index_stats = write_index(tmp, tokens, header["vocab_size"], separator_id(tokens.dtype), params)
    manifest = store_manifest(tmp, tokens, header, params, index_stats, extra, sections)
    publish(tmp, out)
    return manifest


def build(
    sources: list[str],
    out: Path,
    tokenizer,
    *,
    options: SourceOptions = SourceOptions(),
    params: IndexParams = IndexParams(),
    progress: bool = True,
) -> dict:
    """Build a datastore at ``out`` from ``sources``; returns its manifest.

    Raises EmptyCorpusError (naming the sources), InvalidInputError (also for an ``out`` that
    is not ours to replace, ``check_out``), TokenIdOutOfRangeError; on any failure the previous
    ``out`` is left as it was.
    """
    out = check_out(out)
    vocab_size = tokenizer_vocab_size(tokenizer)
    dtype = token_dtype(vocab_size)
    tmp = temp_dir_next_to(out)
    try:
        start = time.perf_counter()
        docs = iter_documents(sources, options)
        corpus = encode_corpus(docs, tokenizer, tmp / SPOOL, dtype=dtype, sep=separator_id(dtype),
                               vocab_size=vocab_size, progress=progress)
        if corpus.documents == 0:
            raise empty_corpus(sources, options)
        tokenize_seconds = time.perf_counter() - start
        tokens = np.fromfile(tmp / SPOOL, dtype=dtype)
        (tmp / SPOOL).unlink()
        header = {"vocab_size": vocab_size, "fingerprint": tokenizer_fingerprint(tokenizer),
                  "documents": corpus.documents}
        if progress:
            print(f"indexing {tokens.size} tokens", file=sys.stderr)
        extra = {"tokenize_seconds": round(tokenize_seconds, 3), "engine": "local"}
        return finish_store(tmp, out, tokens, header, params, extra)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def merge(first: Path, second: Path, out: Path, *, params: IndexParams | None = None) -> dict:
    """Merge two datastores built with the same tokenizer into ``out`` (recounting from the streams).

    The result equals a build over the first store's documents followed by
    the second's. ``params`` default to the first store's. Raises
    TokenizerMismatchError when the fingerprints or vocabularies differ, InvalidInputError
    for an ``out`` that is not ours to replace (``check_out``).
    """
    out = check_out(out)
    a = open_datastore(first)
    b = open_datastore(second)
    if isinstance(a, ShardedDatastore) or isinstance(b, ShardedDatastore):
        raise InvalidInputError("merge takes flat stores; build a sharded store from the sources instead")
    if a.fingerprint != b.fingerprint or a.vocab_size != b.vocab_size:
        raise TokenizerMismatchError(f"cannot merge: {first} and {second} were built with different tokenizers")
    params = params or IndexParams(**a.manifest["params"])
    tokens = np.concatenate([a.tokens, b.tokens])
    header = {"vocab_size": a.vocab_size, "fingerprint": a.fingerprint,
              "documents": a.manifest["stats"]["documents"] + b.manifest["stats"]["documents"]}
    del a, b
    tmp = temp_dir_next_to(out)
    try:
        return finish_store(tmp, out, tokens, header, params, {"merged_from": 2})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
