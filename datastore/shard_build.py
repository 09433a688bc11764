"""Build a sharded store (format 4): the corpus cut into shards of whole documents, each indexed
and written on its own, then the corpus's n-gram table counted across them (``shard_table``).

Cutting rule (``split_shards``): documents in stream order; a shard is closed before the
document that would take it past ``shard_tokens`` tokens (a longer document is a shard alone).
It depends only on the documents' lengths, so every engine cuts the same shards, and
``write_shard`` writes a shard's directory from its tokens alone (no timings in it): the
local and Ray builds give byte-identical shards.

One process holds one shard's arrays at a time (its stream, suffix array and counts while it is
indexed and written); the table is counted one first-token range at a time. Everything goes into
a temp directory renamed into place when complete, as for a flat store.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from retrieval_draft.atomic import temp_dir_next_to
from retrieval_draft.errors import EmptyCorpusError, InvalidInputError
from retrieval_draft.store.arrow_io import write_table
from retrieval_draft.store.layout import (
    MAX_STREAM_TOKENS, NGRAM, RARE_FILTER, SHARD_TABLE_MIN, SHARDED_FILES, SHARDED_VERSION, separator_id, shard_name,
    token_dtype,
)
from retrieval_draft.store.manifest import manifest_digest, write_manifest
from retrieval_draft.store.rare_filter import build_filter
from retrieval_draft.store.suffix_trie import key_width
from retrieval_draft.store.tokenizer import tokenizer_fingerprint, tokenizer_vocab_size
from retrieval_draft_datastore.builder import publish, store_manifest
from retrieval_draft_datastore.encode import encode_chunks
from retrieval_draft_datastore.index import IndexParams, _ngram_columns, write_index
from retrieval_draft_datastore.out_path import check_out
from retrieval_draft_datastore.shard_table import bucket_rows, count_range, join_ranges, table_cuts
from retrieval_draft_datastore.sources import SourceOptions, empty_corpus, iter_documents


def check_shard_tokens(shard_tokens: int) -> int:
    """``shard_tokens`` if it is a usable shard size (1 .. MAX_STREAM_TOKENS), else InvalidInputError."""
    if not 1 <= int(shard_tokens) <= MAX_STREAM_TOKENS:
        raise InvalidInputError(f"--shard-tokens must be in 1..{MAX_STREAM_TOKENS} (positions fit 31 bits)")
    return int(shard_tokens)


def split_shards(chunks: Iterable[np.ndarray], shard_tokens: int, sep: int) -> Iterator[np.ndarray]:
    """Shard streams, each a run of whole documents (separator-terminated) of at most
    ``shard_tokens`` tokens unless one document alone is longer. ``chunks``: (n_i,) arrays of
    whole documents in stream order. Holds one shard at a time. InvalidInputError for a document
    past MAX_STREAM_TOKENS."""
    pieces: list[np.ndarray] = []
    size = 0
    for chunk in chunks:
        ends = np.flatnonzero(chunk == sep) + 1
        start = 0
        for end in ends.tolist():
            length = end - start
            if length > MAX_STREAM_TOKENS:
                raise InvalidInputError(f"a document of {length} tokens does not fit one shard (2**31 - 2)")
            if size and size + length > shard_tokens:
                yield np.concatenate(pieces)
                pieces, size = [], 0
            pieces.append(chunk[start:end])
            size += length
            start = end
    if pieces:
        yield np.concatenate(pieces)


def write_shard(directory: Path, tokens: np.ndarray, header: dict, params: IndexParams) -> tuple[dict, dict]:
    """Index ``tokens`` (a shard's stream) into the new directory ``directory`` as a format-3 store
    whose own table is empty (``SHARD_TABLE_MIN``). ``header``: vocab_size, fingerprint.
    Returns (the shard's record for the store manifest, index seconds per phase)."""
    directory.mkdir()
    shard_params = replace(params, table_min_total=SHARD_TABLE_MIN)
    stats = write_index(directory, tokens, header["vocab_size"], separator_id(tokens.dtype), shard_params)
    seconds = stats.pop("index_seconds")
    documents = int(np.count_nonzero(tokens == separator_id(tokens.dtype)))
    store_manifest(directory, tokens, {**header, "documents": documents}, shard_params, stats, {})
    record = {"dir": directory.name, "tokens": int(tokens.size), "documents": documents,
              "manifest_sha256": manifest_digest(directory)}
    return record, seconds


def write_store_table(tmp: Path, shard_dirs: list[Path], vocab_size: int, dtype: np.dtype, params: IndexParams,
                      count_all: Callable | None = None) -> dict:
    """Count the corpus's n-gram table across ``shard_dirs`` into ``tmp``/ngram.arrow and the
    rare-context filter into ``tmp``/rare_contexts.arrow. ``count_all`` maps a list of (c0, c1) id
    ranges to their ``count_range`` results (default: one after another here). Returns the count
    dtype, contexts per order, ranges counted, rare contexts."""
    cuts = table_cuts(bucket_rows(shard_dirs, vocab_size))
    ranges = [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]
    if count_all is None:
        parts = [count_range(shard_dirs, c0, c1, params) for c0, c1 in ranges]
    else:
        parts = count_all(ranges)
    per_order = join_ranges([table for table, _ in parts], params.max_order)
    columns = _ngram_columns(per_order, params.max_order, dtype)
    write_table(tmp / NGRAM, columns)
    shard_of = np.concatenate([pairs[0] for _, pairs in parts])
    hashes = np.concatenate([pairs[1] for _, pairs in parts])
    filters = [build_filter(hashes[shard_of == i]) for i in range(len(shard_dirs))]
    write_table(tmp / RARE_FILTER, {"word": np.concatenate(filters)})
    return {"count_dtype": columns["total"].dtype.name, "contexts_per_order": [int(len(t[3])) for t in per_order],
            "table_ranges": len(ranges), "rare_contexts": int(hashes.size),
            "rare_filter_words": [int(f.size) for f in filters]}


def write_sharded_manifest(tmp: Path, records: list[dict], header: dict, dtype: np.dtype, params: IndexParams,
                           table: dict, extra: dict) -> dict:
    """The top manifest of a sharded store in ``tmp`` (``layout``): shards, table, totals, ``extra`` stats."""
    body = {
        "format_version": SHARDED_VERSION,
        "tokenizer": {"fingerprint": header["fingerprint"], "vocab_size": header["vocab_size"]},
        "storage": {"dtype": dtype.name, "separator_id": separator_id(dtype),
                    "trie_key_width": key_width(header["vocab_size"]), "count_dtype": table["count_dtype"],
                    "rare_filter_words": table["rare_filter_words"]},
        "params": params.to_dict(),
        "stats": {"documents": sum(r["documents"] for r in records), "tokens": sum(r["tokens"] for r in records),
                  "shards": len(records), "contexts_per_order": table["contexts_per_order"], **extra},
        "shards": records,
    }
    return write_manifest(tmp, body, SHARDED_FILES)


def build_sharded_from_chunks(chunks: Iterable[np.ndarray], out: Path, header: dict, dtype: np.dtype,
                              params: IndexParams, shard_tokens: int, *, extra: dict | None = None,
                              progress: bool = False) -> dict:
    """Build a sharded store at ``out`` from token ``chunks`` (whole separator-terminated documents,
    ``dtype``), one shard after another in this process; returns the manifest.
    ``header``: vocab_size, fingerprint. Raises EmptyCorpusError, InvalidInputError; on any
    failure ``out`` is left as it was (``check_out`` refuses an ``out`` that is not ours to replace)."""
    check_shard_tokens(shard_tokens)
    out = check_out(out)
    tmp = temp_dir_next_to(out)
    try:
        start = time.perf_counter()
        records = []
        for i, tokens in enumerate(split_shards(chunks, shard_tokens, separator_id(dtype))):
            records.append(write_shard(tmp / shard_name(i), tokens, header, params)[0])
            if progress:
                print(f"shard {i}: {records[-1]['tokens']} tokens", file=sys.stderr)
        if not records:
            raise EmptyCorpusError("the corpus produced no tokens")
        shard_seconds = time.perf_counter() - start
        start = time.perf_counter()
        table = write_store_table(tmp, [tmp / r["dir"] for r in records], header["vocab_size"], dtype, params)
        timings = {"shards_seconds": round(shard_seconds, 3), "table_seconds": round(time.perf_counter() - start, 3)}
        manifest = write_sharded_manifest(tmp, records, header, dtype, params, table,
                                          {**(extra or {}), **timings, "table_ranges": table["table_ranges"],
                                           "rare_contexts": table["rare_contexts"]})
        publish(tmp, out)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_sharded(sources: list[str], out: Path, tokenizer, shard_tokens: int, *,
                  options: SourceOptions = SourceOptions(), params: IndexParams = IndexParams(),
                  progress: bool = True) -> dict:
    """``retrieval-draft build --shard-tokens N``: tokenise ``sources`` in batches and build a
    sharded store at ``out`` in this process (``build_sharded_from_chunks``); returns its manifest."""
    check_shard_tokens(shard_tokens)
    check_out(out)
    vocab_size = tokenizer_vocab_size(tokenizer)
    dtype = token_dtype(vocab_size)
    header = {"vocab_size": vocab_size, "fingerprint": tokenizer_fingerprint(tokenizer)}
    chunks = encode_chunks(iter_documents(sources, options), tokenizer, dtype=dtype, sep=separator_id(dtype),
                           vocab_size=vocab_size)
    try:
        return build_sharded_from_chunks(chunks, out, header, dtype, params, shard_tokens,
                                         extra={"engine": "local"}, progress=progress)
    except EmptyCorpusError:
        raise empty_corpus(sources, options) from None
