"""Open a datastore: validate everything, then expose read-only numpy views.

Opening checks, in order: manifest (version first, then its own checksum),
size and sha256 of every data file (before any is parsed: a corrupt trie
file can crash libdatrie), Arrow structure (``validate(full=True)``),
schemas and lengths, and that every stored id is below the vocabulary size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from retrieval_draft.errors import CorruptDatastoreError, TokenIdOutOfRangeError
from retrieval_draft.store.arrow_io import read_table
from retrieval_draft.store.layout import (
    NGRAM, PACKED_SINCE, SHARDED_VERSION, SUFFIX_ARRAY, SUFFIX_RANGES, TOKENS, TRIE, separator_id, token_dtype,
)
from retrieval_draft.store.manifest import ManifestFields, check_sizes, read_manifest, verify_files
from retrieval_draft.store.packed import max_position, packed_words, position_bits, unpack_positions
from retrieval_draft.store.suffix_trie import key_width, load_trie

if TYPE_CHECKING:
    import datrie


def _read_only(array: np.ndarray) -> np.ndarray:
    """``array`` marked read-only, as the memory-mapped arrays it stands in for are: the query
    kernels then compile once for both (Numba compiles a copy per writability)."""
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class NgramTable:
    """The Markov table, rows sorted by (order, context).

    Attributes:
        offsets: (max_order + 2,) int64; rows of order n are offsets[n]:offsets[n+1].
        context: (R, max_order) ids, zero-padded past the row's order.
        next: (R, top_k) ids; count: (R, top_k) uint16/uint32 (0 = empty slot);
        total: (R,) uint16/uint32 continuations of the context.
        min_count: contexts with fewer continuations never draft.
        complete: every context with >= min_count continuations has a row (v1, v2, or a table
            built down to min_count); otherwise contexts rarer than the table's threshold are
            counted from the suffix array.
        rare_filter: (W,) uint64, one Bloom filter per shard of the contexts too rare for the
            table that draft and occur in that shard (sharded stores, ``rare_filter``);
            rare_offsets: (S + 1,) int64, shard i's filter is rare_filter[off[i]:off[i + 1]].
            Both empty (flat stores): every table miss is counted in every shard.
    """

    offsets: np.ndarray
    context: np.ndarray
    next: np.ndarray
    count: np.ndarray
    total: np.ndarray
    min_count: int
    complete: bool
    rare_filter: np.ndarray = field(default_factory=lambda: _read_only(np.zeros(0, np.uint64)))
    rare_offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def as_kernel_tuple(self) -> tuple:
        """What ``query.context_row`` takes as ``table``."""
        return (self.offsets, self.context, self.next, self.count, self.total, self.min_count, self.complete,
                self.rare_filter, self.rare_offsets)


@dataclass(frozen=True)
class Datastore(ManifestFields):
    """A validated datastore: manifest plus memory-mapped arrays and the loaded trie."""

    path: Path
    manifest: dict
    tokens: np.ndarray  # (T,) uint16/uint32 stream with separators
    suffix_words: np.ndarray  # (W,) uint32: T positions packed at position_bits each (``store.packed``)
    position_bits: int  # 32 for v1/v2 stores, whose words are plain positions
    range_lo: np.ndarray  # (K,) uint32, one per trie key
    range_hi: np.ndarray  # (K,) uint32
    trie: datrie.BaseTrie
    ngrams: NgramTable

    def suffix_array(self) -> np.ndarray:
        """The suffix array unpacked, (T,) uint32 (a copy for v3 stores: for tools and tests)."""
        return unpack_positions(self.suffix_words, self.position_bits, self.tokens.size)

    @property
    def shards(self) -> tuple["Datastore", ...]:
        """The indexes drafted from: this store alone (a sharded store has many, ``sharded``)."""
        return (self,)

    def first_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi), each (vocab_size,) uint32: the suffix-array rows starting with id t are
        lo[t]:hi[t]. Format 3 stores them (rows 0..vocab-1 of suffix_ranges); for v1/v2 stores
        every id gets the whole array, which the kernels' binary search narrows the same way."""
        vocab = self.vocab_size
        if self.manifest["format_version"] >= PACKED_SINCE:
            return self.range_lo[:vocab], self.range_hi[:vocab]
        lo, hi = np.zeros(vocab, np.uint32), np.full(vocab, self.tokens.size, np.uint32)
        lo.flags.writeable = hi.flags.writeable = False  # the same Numba types as memory-mapped views
        return lo, hi

    @cached_property
    def kernel_arrays(self) -> tuple:
        """The query kernels' view of this store's shards (``shard_arrays``), built once per store."""
        from retrieval_draft.store.shard_arrays import shard_arrays

        return shard_arrays(self.shards, self.separator, self.vocab_size)


def _check_storage(manifest: dict) -> np.dtype:
    """The stream dtype after checking the storage section against the vocabulary size."""
    try:
        vocab_size = int(manifest["tokenizer"]["vocab_size"])
        dtype = token_dtype(vocab_size)
        storage = manifest["storage"]
        params = manifest["params"]
        int(params["max_order"]), int(params["top_k"]), int(manifest["stats"]["tokens"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptDatastoreError(f"manifest is missing or has a bad field ({exc})") from exc
    check_storage(storage, vocab_size)
    if storage.get("count_dtype", "uint32") not in ("uint16", "uint32"):
        raise CorruptDatastoreError(f"manifest count dtype {storage.get('count_dtype')!r} is not uint16 or uint32")
    packed = manifest["format_version"] >= PACKED_SINCE
    if packed and storage.get("position_bits") != position_bits(max(1, int(manifest["stats"]["tokens"]))):
        raise CorruptDatastoreError("manifest position width does not match its token count")
    return dtype


def check_ids(name: str, ids: np.ndarray, vocab_size: int, sep: int | None) -> None:
    """Raise TokenIdOutOfRangeError if any id (other than ``sep``) is >= vocab_size."""
    if ids.size == 0:
        return
    if sep is not None:
        ids = ids[ids != sep]
    if ids.size and int(ids.max()) >= vocab_size:
        raise TokenIdOutOfRangeError(f"{name}: id {int(ids.max())} is outside the vocabulary of size {vocab_size}")


def _check_values(manifest: dict, tokens, words, bits, ranges, ngrams: NgramTable) -> None:
    """Full scans: positions inside the stream, every id inside the vocabulary."""
    n = int(manifest["stats"]["tokens"])
    if max_position(words, bits, n) >= n or (ranges["hi"].size and int(ranges["hi"].max()) > n):
        raise CorruptDatastoreError("suffix array or ranges point past the end of the stream")
    vocab_size = int(manifest["tokenizer"]["vocab_size"])
    check_ids(TOKENS, tokens, vocab_size, separator_id(tokens.dtype))
    check_ids(NGRAM, ngrams.context, vocab_size, None)
    check_ids(NGRAM, ngrams.next, vocab_size, None)


def ngram_table(directory: Path, dtype: np.dtype, manifest: dict, full: bool = True) -> NgramTable:
    """The n-gram table ``directory``/ngram.arrow as the manifest describes it (params, count dtype)."""
    max_order, top_k = int(manifest["params"]["max_order"]), int(manifest["params"]["top_k"])
    ids = pa.from_numpy_dtype(dtype)
    counts = pa.from_numpy_dtype(np.dtype(manifest["storage"].get("count_dtype", "uint32")))
    cols = read_table(directory / NGRAM, {
        "order": pa.uint8(), "context": pa.list_(ids, max_order), "next": pa.list_(ids, top_k),
        "count": pa.list_(counts, top_k), "total": counts}, full=full)
    order = cols["order"]
    if order.size and (order[0] < 1 or order[-1] > max_order):
        raise CorruptDatastoreError(f"{NGRAM}: orders are not within 1..{max_order}")
    if full and order.size and np.any(np.diff(order.astype(np.int16)) < 0):  # a full scan: verified opens only
        raise CorruptDatastoreError(f"{NGRAM}: orders are not sorted")
    # Search values of the column's own dtype: mixed dtypes would convert the whole column first.
    offsets = np.searchsorted(order, np.arange(max_order + 2, dtype=order.dtype), side="left").astype(np.int64)
    params = manifest["params"]  # a table down to min_count holds every context that drafts (v1, v2 always)
    complete = manifest["format_version"] < PACKED_SINCE or int(params.get("table_min_total", 0)) <= int(
        params.get("min_count", 1))
    return NgramTable(offsets, cols["context"], cols["next"], cols["count"], cols["total"],
                      int(manifest["params"].get("min_count", 1)), complete)


def _suffix_words(directory: Path, manifest: dict, full: bool) -> tuple[np.ndarray, int]:
    """(words, bits) of the suffix array: packed words (v3) or plain uint32 positions (bits 32)."""
    n = int(manifest["stats"]["tokens"])
    if manifest["format_version"] < PACKED_SINCE:
        return read_table(directory / SUFFIX_ARRAY, {"pos": pa.uint32()}, full=full)["pos"], 32
    bits = int(manifest["storage"]["position_bits"])
    words = read_table(directory / SUFFIX_ARRAY, {"word": pa.uint32()}, full=full)["word"]
    if words.size != packed_words(n, bits):
        raise CorruptDatastoreError(f"{SUFFIX_ARRAY}: {words.size} words, {packed_words(n, bits)} expected")
    return words, bits


def open_flat(path: str | Path, manifest: dict | None = None, *, verify: bool = True) -> Datastore:
    """Open and validate the one-index store (or shard) at ``path`` (``manifest``: its manifest,
    read here when None); ``opening.open_datastore`` opens either kind.

    ``verify=False`` skips every check that reads whole files (sha256, full
    Arrow validation, id ranges): only for files whose exact bytes were verified
    before (``retrieval_draft.store.store_cache`` keeps such records). The manifest's
    own checksum, sizes, schemas and lengths are checked either way.
    Raises CorruptDatastoreError, UnknownFormatVersionError, TokenIdOutOfRangeError.
    """
    directory = Path(path)
    manifest = read_manifest(directory) if manifest is None else manifest
    if manifest["format_version"] == SHARDED_VERSION:
        raise CorruptDatastoreError(f"{directory} is a store of shards where one index was expected")
    dtype = _check_storage(manifest)
    if verify:
        verify_files(directory, manifest)
    else:
        check_sizes(directory, manifest)
    ids = pa.from_numpy_dtype(dtype)
    tokens = read_table(directory / TOKENS, {"token": ids}, full=verify)["token"]
    words, bits = _suffix_words(directory, manifest, full=verify)
    ranges = read_table(directory / SUFFIX_RANGES, {"lo": pa.uint32(), "hi": pa.uint32()}, full=verify)
    ngrams = ngram_table(directory, dtype, manifest, full=verify)
    n = int(manifest["stats"]["tokens"])
    sep = separator_id(dtype)
    if tokens.size != n or (bits == 32 and words.size != n) or n == 0 or tokens[-1] != sep:
        raise CorruptDatastoreError(f"stream of {tokens.size} tokens / suffix array does not match manifest {n}")
    if verify:
        _check_values(manifest, tokens, words, bits, ranges, ngrams)
    trie = load_trie(directory / TRIE)
    rows = ranges["lo"].size
    packed = manifest["format_version"] >= PACKED_SINCE  # v3: one range per id first, then longer keys
    if packed and rows < int(manifest["tokenizer"]["vocab_size"]):
        raise CorruptDatastoreError(f"{SUFFIX_RANGES}: {rows} ranges, fewer than the vocabulary")
    if verify and (len(trie) > rows if packed else len(trie) != rows):  # len() walks the whole trie
        raise CorruptDatastoreError(f"{TRIE}: {len(trie)} keys but {rows} ranges")
    return Datastore(directory, manifest, tokens, words, bits, ranges["lo"], ranges["hi"], trie, ngrams)


def check_storage(storage: dict, vocab_size: int) -> None:
    """CorruptDatastoreError where a manifest's ``storage`` fields (stream dtype, separator, trie key
    width) do not follow from its vocabulary size; a flat store's and a sharded store's alike."""
    dtype = token_dtype(vocab_size)
    if storage.get("dtype") != dtype.name or storage.get("separator_id") != separator_id(dtype):
        raise CorruptDatastoreError("manifest storage dtype/separator do not match its vocabulary size")
    if storage.get("trie_key_width") != key_width(vocab_size):
        raise CorruptDatastoreError("manifest trie key width does not match its vocabulary size")

