"""llama.cpp's n-gram lookup cache file: encode records, and read a file back.

The format is the one ``common_ngram_cache_save`` writes and ``common_ngram_cache_load``
reads (llama.cpp ``common/ngram-cache.h`` / ``.cpp``); ``llama-lookup-create`` writes
it and ``llama-server --spec-type ngram-cache --lookup-cache-static FILE`` loads it.
No header, no record count, no checksum: records follow each other to the end of
the file, every field a 32-bit signed integer in the writer's byte order (we write
little-endian, the order of x86-64 and ARM builds)::

    record   = ngram, n, n x (token, count)
    ngram    = int32[LLAMA_NGRAM_MAX = 4]: the context's tokens, padded with
               LLAMA_TOKEN_NULL = -1 (the static cache's contexts are
               LLAMA_NGRAM_STATIC = 2 tokens: a, b, -1, -1)
    n        = int32 > 0: the number of distinct next tokens that follow
    token    = int32 (llama_token) a next token; count = int32 > 0 its count

llama.cpp's loader asserts n > 0 and count > 0, keeps the first record of a context
seen twice (``unordered_map::emplace``) and aborts on a truncated record.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retrieval_draft.errors import RetrievalDraftError

NGRAM_MAX = 4  # LLAMA_NGRAM_MAX: tokens in every record's key
NGRAM_STATIC = 2  # LLAMA_NGRAM_STATIC: context length of the static cache
TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: padding of a key past its context
HEADER_INTS = NGRAM_MAX + 1  # the key, then n
INT32_MAX = 2**31 - 1
FILE_DTYPE = np.dtype("<i4")


class CorruptLookupCacheError(RetrievalDraftError):
    """A llama.cpp lookup cache file is truncated or malformed (``read_lookup_cache``)."""


def encode_records(contexts: np.ndarray, nexts: np.ndarray, counts: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The records of a run of contexts as one little-endian int32 array, ready to write.

    Args:
        contexts: (G, k) integer ids, one row per context, 1 <= k <= NGRAM_MAX.
        nexts: (U,) integer ids: every context's next tokens, context by context.
        counts: (U,) integers in 1..INT32_MAX: their counts.
        starts: (G,) int64: context g's next tokens are nexts[starts[g]:starts[g + 1]]
            (the last runs to U); starts[0] == 0, strictly increasing (every n > 0).
    Returns:
        (5 G + 2 U,) int32 in FILE_DTYPE: G records laid out as the module docstring says.
    """
    groups, width = contexts.shape
    if not 1 <= width <= NGRAM_MAX or starts.shape != (groups,) or nexts.shape != counts.shape:
        raise ValueError("contexts, starts, nexts and counts do not fit together")
    if counts.size and (int(counts.min()) < 1 or int(counts.max()) > INT32_MAX):
        raise ValueError("counts must be within 1..2**31-1")
    sizes = np.diff(np.append(starts, nexts.size))
    out = np.empty(HEADER_INTS * groups + 2 * nexts.size, dtype=FILE_DTYPE)
    head = HEADER_INTS * np.arange(groups, dtype=np.int64) + 2 * starts  # record g's first int
    out[head[:, None] + np.arange(NGRAM_MAX)] = TOKEN_NULL
    out[head[:, None] + np.arange(width)] = contexts
    out[head + NGRAM_MAX] = sizes
    group_of = np.repeat(np.arange(groups, dtype=np.int64), sizes)
    pair = HEADER_INTS * (group_of + 1) + 2 * np.arange(nexts.size, dtype=np.int64)  # pair j's first int
    out[pair] = nexts
    out[pair + 1] = counts
    return out


def read_lookup_cache(path: str | Path) -> dict[tuple[int, ...], dict[int, int]]:
    """Every record of the lookup cache at ``path``: {key (NGRAM_MAX ids, -1 padded): {token: count}}.

    Checks what llama.cpp's loader asserts, and more, so a file it reads is one llama.cpp loads
    the same: whole int32 fields, no truncated record, n > 0, count > 0, no token twice in a
    record and no key twice in the file (llama.cpp would silently keep the first).
    Raises CorruptLookupCacheError (one line naming the record's byte offset).
    """
    raw = Path(path).read_bytes()
    if len(raw) % 4:
        raise CorruptLookupCacheError(f"{path}: {len(raw)} bytes is not a whole number of int32 fields")
    ints = np.frombuffer(raw, dtype=FILE_DTYPE).tolist()
    cache: dict[tuple[int, ...], dict[int, int]] = {}
    at = 0
    while at < len(ints):
        if at + HEADER_INTS > len(ints):
            raise CorruptLookupCacheError(f"{path}: truncated record at byte {4 * at}")
        key, n = tuple(ints[at:at + NGRAM_MAX]), ints[at + NGRAM_MAX]
        pairs = ints[at + HEADER_INTS:at + HEADER_INTS + 2 * n]
        if n < 1 or len(pairs) != 2 * n:
            raise CorruptLookupCacheError(f"{path}: record at byte {4 * at} has {n} next tokens "
                                          f"and {len(pairs) // 2} follow")
        part = dict(zip(pairs[0::2], pairs[1::2]))
        if len(part) != n or min(part.values()) < 1 or key in cache:
            raise CorruptLookupCacheError(f"{path}: record at byte {4 * at} repeats a token or key, "
                                          "or has a count below 1")
        cache[key] = part
        at += HEADER_INTS + 2 * n
    return cache
