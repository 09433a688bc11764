"""``retrieval-draft export STORE --llama-cpp OUT``: a store's 2-token n-gram counts as
llama.cpp's static lookup cache (the file ``llama-lookup-create`` writes, format in
``lookup_cache``).

What goes in: every 2-token context of the store's corpus with every token that follows
it and how often, counted from the store's token stream (all shards), within documents:
a window that touches a document separator is not counted (``llama-lookup-create``
counts one tokenised text with no documents). The store's own n-gram table is not the
source: it keeps only the top-k next tokens of contexts seen at least
``table_min_total`` times and stores counts as uint16, scaled down past 65,535, while
llama.cpp's static cache decides with every next token's count (a draft needs at least
2 continuations and a next token holding at least half of them). ``min_total`` drops
contexts with fewer continuations (a smaller file; llama.cpp also validates its
context-cache drafts against the static counts, so the default keeps all). A count past
2**31 - 1 (int32) is written as 2**31 - 1.

Memory: the windows are counted in passes over the stream, one residue class of the
first token per pass, read in blocks, so a pass sorts about WINDOWS_PER_PASS 8-byte keys
(more where one first id is very frequent) and nothing holds a copy of the whole stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from retrieval_draft.atomic import atomic_path
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.store.manifest import check_store_folder
from retrieval_draft.store.opening import open_datastore
from retrieval_draft_datastore.lookup_cache import INT32_MAX, NGRAM_STATIC, encode_records
from retrieval_draft_datastore.out_path import is_store

WINDOWS_PER_PASS = 1 << 24  # ~16.8M windows: 134 MB of keys per pass, about 3x that while sorting
MAX_VOCAB = 2_097_151  # ids below 2**21: a 3-token window's key (a * V + b) * V + c fits in int64


@dataclass(frozen=True)
class ExportSummary:
    """What one export wrote: contexts (records), continuations ((token, count) pairs),
    windows (3-token windows counted, before ``min_total``) and the file's bytes."""

    path: Path
    contexts: int
    continuations: int
    windows: int
    bytes: int

    def line(self) -> str:
        """The one line the command prints."""
        return (f"exported {self.path}: {self.contexts} contexts of {NGRAM_STATIC} tokens, {self.continuations} "
                f"next tokens, {self.windows} windows counted, {self.bytes} bytes")


def check_export_out(out: str | Path) -> Path:
    """The resolved ``out`` when a lookup cache may be written there: a new file, or a file to
    replace; InvalidInputError for a folder, a missing parent folder, or a path inside a datastore."""
    out = Path(out).resolve()
    if out.is_dir():
        raise InvalidInputError(f"--llama-cpp {out} is a folder; name the file to write")
    if not out.parent.is_dir():
        raise InvalidInputError(f"--llama-cpp {out}: the folder {out.parent} does not exist")
    for parent in out.parents:
        if is_store(parent):
            raise InvalidInputError(f"--llama-cpp {out} is inside the datastore {parent}; choose a path outside it")
    return out


def _pass_keys(stream: np.ndarray, sep: int, vocab: int, passes: int, p: int, block: int) -> np.ndarray:
    """(k,) int64 keys (a * vocab + b) * vocab + c of the 3-token windows (a, b, c) of ``stream``
    that touch no separator and whose first id is ``p`` mod ``passes``; read ``block`` windows at
    a time, so the temporaries stay a few bytes per block position."""
    parts = []
    for start in range(0, max(0, stream.size - 2), block):
        end = min(start + block, stream.size - 2)
        a, b, c = stream[start:end], stream[start + 1:end + 1], stream[start + 2:end + 2]
        at = np.flatnonzero((a % passes == p) & (a != sep) & (b != sep) & (c != sep))
        parts.append((a[at].astype(np.int64) * vocab + b[at]) * vocab + c[at])
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def bigram_counts(streams: list[np.ndarray], sep: int, vocab: int, min_total: int = 1,
                  windows_per_pass: int = WINDOWS_PER_PASS) -> Iterator[tuple[np.ndarray, ...]]:
    """Every 2-token context of ``streams`` with its next tokens and counts, one pass at a time.

    Args:
        streams: token streams, (T_i,) uint16/uint32, every document followed by ``sep``.
        sep: the separator id; vocab: ids are below it (at most MAX_VOCAB + 1).
        min_total: contexts with fewer 3-token windows are left out.
        windows_per_pass: about this many windows are sorted at once (more where first ids are
            skewed: every window of one first id falls in one pass).
    Yields:
        (contexts (G, 2) int64, nexts (U,) int64, counts (U,) int64 capped at 2**31 - 1,
        starts (G,) int64, windows int): one pass's contexts in sorted order, their next
        tokens sorted within each context (``lookup_cache.encode_records``' layout), and
        the windows the pass counted.
    """
    total = sum(max(0, s.size - 2) for s in streams)
    passes = max(1, math.ceil(total / windows_per_pass))
    for p in range(passes):
        keys = np.concatenate([_pass_keys(s, sep, vocab, passes, p, windows_per_pass) for s in streams])
        keys, counts = np.unique(keys, return_counts=True)
        contexts, nexts = keys // vocab, keys % vocab
        starts = np.flatnonzero(np.r_[True, contexts[1:] != contexts[:-1]]) if keys.size else np.zeros(0, np.int64)
        sizes = np.diff(np.append(starts, keys.size))
        keep = np.add.reduceat(counts, starts) >= min_total if keys.size else np.zeros(0, bool)
        pairs = np.repeat(keep, sizes)
        first = contexts[starts[keep]]
        yield (np.stack([first // vocab, first % vocab], axis=1), nexts[pairs],
               np.minimum(counts[pairs], INT32_MAX), np.cumsum(np.r_[0, sizes[keep]])[:-1].astype(np.int64),
               int(counts.sum()))


def export_llama_cpp(store_path: str | Path, out: str | Path, *, min_total: int = 1) -> ExportSummary:
    """Write the 2-token counts of the store at ``store_path`` to ``out`` as llama.cpp's static
    lookup cache (module docstring), atomically (temp file, fsync, rename; an existing file is
    replaced). Everything is checked before the stream is read.

    Raises InvalidInputError (``min_total`` below 1, ``out`` a folder or inside a datastore, a
    vocabulary past MAX_VOCAB), DatastoreNotFoundError, CorruptDatastoreError (the store's checks).
    """
    if isinstance(min_total, bool) or not isinstance(min_total, int) or min_total < 1:
        raise InvalidInputError(f"--min-total must be an integer >= 1, got {min_total!r}")
    out = check_export_out(out)
    check_store_folder(store_path)
    store = open_datastore(store_path)
    if store.vocab_size > MAX_VOCAB + 1:
        raise InvalidInputError(f"vocabulary of {store.vocab_size} ids: export takes at most {MAX_VOCAB + 1}")
    streams = [shard.tokens for shard in store.shards]
    contexts = continuations = windows = size = 0
    with atomic_path(out) as tmp, open(tmp, "wb") as file:
        for ctx, nexts, counts, starts, counted in bigram_counts(streams, store.separator, store.vocab_size,
                                                                  min_total):
            data = encode_records(ctx, nexts, counts, starts)
            file.write(data.tobytes())
            contexts, continuations = contexts + len(starts), continuations + nexts.size
            windows, size = windows + counted, size + data.nbytes
    return ExportSummary(out, contexts, continuations, windows, size)
