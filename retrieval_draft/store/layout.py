"""On-disk layout of a datastore directory: file names, version, id storage.

A datastore is one directory::

    manifest.json        format version, tokenizer fingerprint, parameters,
                         corpus statistics, sha256 and size of every file
    tokens.arrow         the token stream, column ``token`` (uint16 or uint32);
                         every document is followed by one separator id
    suffix_array.arrow   every stream position, sorted by the first
                         ``sort_depth`` tokens starting there: column ``word``
                         (uint32), the positions packed at
                         ``storage.position_bits`` bits each (v3, see
                         ``retrieval_draft.store.packed``), or column ``pos``
                         (uint32) of plain positions (v1, v2)
    suffix_ranges.arrow  columns ``lo``/``hi`` (uint32): half-open ranges of
                         the suffix array, one per trie key
    suffix.trie          datrie ``BaseTrie``: encoded n-gram -> row of
                         suffix_ranges (see ``retrieval_draft.store.suffix_trie``)
    ngram.arrow          the Markov table: per context (orders 1..max_order)
                         the top-K next tokens with counts; counts and totals
                         uint16 (v2 and v3 builds; a row seen more often is
                         scaled to a total of 65,535) or uint32
                         (``storage.count_dtype``). In v3 only contexts with
                         at least ``params.table_min_total`` continuations;
                         rarer ones are counted from the suffix array

Token ids are stored as uint16 when ``vocab_size <= 65535`` and as uint32
otherwise. The document separator is the largest value of that dtype
(0xFFFF or 0xFFFFFFFF): it can never be a real id (ids are < vocab_size
<= the dtype's maximum), and it sorts after every real id.

Versions: 3 (written now) packs suffix-array positions at the bits the
stream needs and keeps only frequent contexts in the n-gram table: at
about 5.6 bytes per token instead of 10. Version 2 orders the suffix array
by the tokens of a position up to its first separator, then by position
(so shards sort apart and merge; v3 keeps that order), drops n-gram rows
equal to their parent context's row and stores counts as uint16. Version 1
compares straight across separators and stores uint32 counts. All three
open and draft: v1 and v2 tables hold every context, so nothing is counted
from their suffix arrays.

A sharded store (version 4, ``retrieval_draft.store.sharded``) is one
directory too::

    manifest.json        as above, plus ``shards``: per shard its directory
                         name, tokens, documents and the sha256 of its manifest
    ngram.arrow          the n-gram table of the whole corpus, byte for byte
                         the table a one-shard build writes (counted across
                         the shards by the builder, ``shard_table``)
    rare_contexts.arrow  column ``word`` (uint64): a Bloom filter of the
                         contexts too rare for the table that still draft
                         (``retrieval_draft.store.rare_filter``)
    shard-00000/ ...     one version-3 store per shard, a run of whole
                         documents of at most ``MAX_STREAM_TOKENS`` tokens; its
                         own ngram.arrow holds no rows (``SHARD_TABLE_MIN``)

so a corpus past 2**31 tokens is one store, queried as one.
"""

from __future__ import annotations

import numpy as np

FORMAT_VERSION = 3
SHARDED_VERSION = 4  # a manifest that lists shards (each a FORMAT_VERSION store) and one n-gram table
SUPPORTED_VERSIONS = (1, 2, 3, 4)
PACKED_SINCE = 3  # first version with packed positions and a frequent-contexts-only table

MANIFEST = "manifest.json"
TOKENS = "tokens.arrow"
SUFFIX_ARRAY = "suffix_array.arrow"
SUFFIX_RANGES = "suffix_ranges.arrow"
TRIE = "suffix.trie"
NGRAM = "ngram.arrow"
DATA_FILES = (TOKENS, SUFFIX_ARRAY, SUFFIX_RANGES, TRIE, NGRAM)
RARE_FILTER = "rare_contexts.arrow"
SHARDED_FILES = (NGRAM, RARE_FILTER)  # the data files at the top of a sharded store
SHARD_TABLE_MIN = 2**32 - 1  # a shard's own table threshold: no rows (the store's table holds the counts)

MAX_STORED_TOTAL = 0xFFFF  # v2 builds scale the few bigger n-gram rows down to this total
UINT16_MAX_VOCAB = 0xFFFF  # ids 0..65534 plus separator 0xFFFF
UINT32_MAX_VOCAB = 0xFFFFFFFF
MAX_STREAM_TOKENS = 2**31 - 2  # positions fit 31 bits


SHARD_PREFIX = "shard-"


def shard_name(index: int) -> str:
    """Directory name of shard ``index`` (0-based) inside a sharded store."""
    return f"{SHARD_PREFIX}{index:05d}"


def token_dtype(vocab_size: int) -> np.dtype:
    """Storage dtype for ids ``0 .. vocab_size - 1`` plus the separator."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if vocab_size <= UINT16_MAX_VOCAB:
        return np.dtype(np.uint16)
    if vocab_size <= UINT32_MAX_VOCAB:
        return np.dtype(np.uint32)
    raise ValueError(f"vocab_size {vocab_size} does not fit in 32-bit token ids")


def separator_id(dtype: np.dtype) -> int:
    """The document separator: the largest value of the storage dtype."""
    return int(np.iinfo(np.dtype(dtype)).max)


def count_dtype(max_total: int) -> np.dtype:
    """Storage dtype of n-gram counts and totals: uint16 when ``max_total`` fits, else uint32."""
    if max_total < 0 or max_total > 0xFFFFFFFF:
        raise ValueError(f"n-gram total {max_total} does not fit in 32 bits")
    return np.dtype(np.uint16 if max_total <= 0xFFFF else np.uint32)
