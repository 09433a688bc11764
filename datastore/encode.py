"""Tokenise a document stream in batches into one flat token stream on disk.

Every document is followed by the separator id, so no n-gram or
continuation ever spans two documents. Token chunks are appended to a spool
file as they are produced, so memory stays bounded by one batch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from retrieval_draft.errors import TokenIdOutOfRangeError

BATCH_DOCS = 256
BATCH_CHARS = 4 << 20


@dataclass(frozen=True)
class CorpusStats:
    """Counts of an encoded corpus: documents kept, stream length (incl. separators)."""

    documents: int
    tokens: int


def document_batches(docs: Iterable[str], max_docs: int, max_chars: int) -> Iterator[list[str]]:
    """Group documents into batches of at most ``max_docs`` docs or about ``max_chars`` chars."""
    batch: list[str] = []
    chars = 0
    for doc in docs:
        batch.append(doc)
        chars += len(doc)
        if len(batch) >= max_docs or chars >= max_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _encode_ids(tokenizer, batch: list[str]) -> list[list[int]]:
    """Ids of each text without special tokens; uses the Rust backend directly when exposed (~25% faster)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch_fast"):
        return [encoding.ids for encoding in backend.encode_batch_fast(batch, add_special_tokens=False)]
    return tokenizer(batch, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]


def encode_batch(tokenizer, batch: list[str], sep: int, vocab_size: int) -> np.ndarray:
    """Token ids of ``batch``, each non-empty document followed by ``sep``; shape (n,), int64.

    Raises TokenIdOutOfRangeError when the tokenizer emits an id >= vocab_size.
    """
    encoded = [ids for ids in _encode_ids(tokenizer, batch) if ids]
    total = sum(len(ids) + 1 for ids in encoded)
    flat = np.fromiter(chain.from_iterable(chain(ids, (sep,)) for ids in encoded), dtype=np.int64, count=total)
    if flat.size:
        content = flat[flat != sep]
        if content.size and (content.min() < 0 or content.max() >= vocab_size):
            raise TokenIdOutOfRangeError(
                f"tokenizer produced id {int(content.max())} outside vocabulary of size {vocab_size}"
            )
    return flat


def encode_texts(tokenizer, texts: list[str], vocab_size: int) -> list[np.ndarray]:
    """Ids of each text without special tokens and without separators; a list of (n_i,) int64 arrays
    (empty for a text with no tokens), in the order of ``texts``.

    Raises TokenIdOutOfRangeError when the tokenizer emits an id >= vocab_size.
    """
    encoded = [np.asarray(ids, dtype=np.int64) for ids in _encode_ids(tokenizer, texts)] if texts else []
    for ids in encoded:
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise TokenIdOutOfRangeError(
                f"tokenizer produced id {int(ids.max())} outside vocabulary of size {vocab_size}"
            )
    return encoded


def encode_chunks(docs: Iterable[str], tokenizer, *, dtype: np.dtype, sep: int, vocab_size: int) -> Iterator[np.ndarray]:
    """The stream ``encode_corpus`` writes, as one (n,) ``dtype`` array per batch of documents
    (each ends with a separator; empty documents dropped). Raises TokenIdOutOfRangeError."""
    for batch in document_batches(docs, BATCH_DOCS, BATCH_CHARS):
        flat = encode_batch(tokenizer, batch, sep, vocab_size)
        if flat.size:
            yield flat.astype(dtype)


def encode_corpus(
    docs: Iterable[str],
    tokenizer,
    spool: Path,
    *,
    dtype: np.dtype,
    sep: int,
    vocab_size: int,
    progress: bool = True,
) -> CorpusStats:
    """Tokenise ``docs`` into the raw file ``spool`` (native-endian ``dtype``), with a tqdm bar on stderr.

    A corpus in which no document yields a token gives ``documents == 0``; the caller, which
    knows the sources, refuses it (``sources.empty_corpus``).
    """
    from tqdm import tqdm

    documents = tokens = 0
    bar = tqdm(desc="tokenising", unit="doc", file=sys.stderr, disable=not progress, mininterval=0.5)
    with open(spool, "wb") as out:
        for batch in document_batches(docs, BATCH_DOCS, BATCH_CHARS):
            flat = encode_batch(tokenizer, batch, sep, vocab_size)
            kept = int(np.count_nonzero(flat == sep))
            out.write(flat.astype(dtype).tobytes())
            documents += kept
            tokens += int(flat.size)
            bar.update(len(batch))
            bar.set_postfix(tokens=tokens, refresh=False)
    bar.close()
    return CorpusStats(documents=documents, tokens=tokens)
