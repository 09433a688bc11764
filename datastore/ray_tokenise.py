"""Stage 1 of the Ray build: read and tokenise shards of files in a Ray Data actor pool.

A shard is a run of consecutive files (``SourceFile``) in reading order. Each
actor of the pool loads the tokenizer once (its constructor) and turns one
shard at a time into a token stream exactly as the single-process build
would (``encode.encode_batch``: every document followed by the separator),
so concatenating the shards in shard order gives the single-process stream.
Ray Data restarts an actor whose process dies and re-runs its shard; a shard
is a pure function of its files, so a retry gives the same tokens.
Imports ``ray`` lazily: this module loads without it.
"""

from __future__ import annotations

import json
from itertools import chain

import numpy as np

from retrieval_draft import errors
from retrieval_draft.errors import RetrievalDraftError
from retrieval_draft_datastore.encode import BATCH_CHARS, BATCH_DOCS, document_batches, encode_batch
from retrieval_draft_datastore.sources import SourceFile, SourceOptions, file_documents

DEFAULT_SHARD_BYTES = 32 << 20


def plan_shards(files: list[SourceFile], workers: int, max_bytes: int = DEFAULT_SHARD_BYTES) -> list[list[SourceFile]]:
    """Consecutive groups of ``files``: about four per worker, each at most ``max_bytes`` of input
    (a single larger file is its own shard). Order is kept."""
    total = sum(f.size for f in files)
    target = max(1, min(max_bytes, total // max(1, 4 * workers)))
    shards: list[list[SourceFile]] = []
    size = 0
    for file in files:
        if not shards or size + file.size > target:
            shards.append([])
            size = 0
        shards[-1].append(file)
        size += file.size
    return shards


class PortableTokenizer:
    """A fast tokenizer's Rust backend as JSON: workers rebuild it with the ``tokenizers`` package
    alone (no ``transformers`` import per worker) and encode exactly as the HF tokenizer does
    with ``add_special_tokens=False``."""

    def __init__(self, tokenizer) -> None:
        self.json = tokenizer.backend_tokenizer.to_str()

    @staticmethod
    def of(tokenizer):
        """A PortableTokenizer for a fast HF tokenizer, else the tokenizer itself (pickled whole)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        return PortableTokenizer(tokenizer) if hasattr(backend, "encode_batch_fast") else tokenizer

    def load(self):
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(self.json)
        return type("BackendOnly", (), {"backend_tokenizer": backend})()


class ShardTokeniser:
    """Ray Data callable class: a batch of shards (columns ``shard``, ``files``) to token streams.

    Output columns: ``shard`` (int64), ``tokens`` (bytes of a native ``dtype``
    array), ``documents`` (int64, documents that produced tokens), ``error``
    (JSON ``[class name, message]`` of a ``RetrievalDraftError`` the shard
    raised, such as bad JSON or an id outside the vocabulary, else "").
    """

    def __init__(self, tokenizer, options: SourceOptions, dtype: str, sep: int, vocab_size: int) -> None:
        self.tokenizer = tokenizer.load() if isinstance(tokenizer, PortableTokenizer) else tokenizer
        self.options = options
        self.dtype = np.dtype(dtype)
        self.sep = int(sep)
        self.vocab_size = int(vocab_size)

    def tokenise(self, files: list[SourceFile]) -> tuple[np.ndarray, int]:
        """(stream of the shard, shape (n,), ``dtype``; documents kept)."""
        docs = chain.from_iterable(file_documents(f, self.options) for f in files)
        pieces, documents = [], 0
        for batch in document_batches(docs, BATCH_DOCS, BATCH_CHARS):
            flat = encode_batch(self.tokenizer, batch, self.sep, self.vocab_size)
            documents += int(np.count_nonzero(flat == self.sep))
            pieces.append(flat.astype(self.dtype))
        stream = np.concatenate(pieces) if pieces else np.zeros(0, self.dtype)
        return stream, documents

    def __call__(self, batch: dict) -> dict:
        shards, streams, documents, errors = [], [], [], []
        for shard, files in zip(batch["shard"], batch["files"]):
            try:  # our typed errors travel as data: Ray would keep only their traceback text
                stream, kept = self.tokenise([SourceFile(*f) for f in json.loads(files)])
                error = ""
            except RetrievalDraftError as exc:
                stream, kept, error = np.zeros(0, self.dtype), 0, json.dumps([type(exc).__name__, str(exc)])
            shards.append(int(shard))
            streams.append(stream.tobytes())
            documents.append(kept)
            errors.append(error)
        return {"shard": np.array(shards, np.int64), "tokens": np.array(streams, dtype=object),
                "documents": np.array(documents, np.int64), "error": np.array(errors, dtype=object)}


def tokenise_shards(shards: list[list[SourceFile]], tokenizer, options: SourceOptions, dtype: np.dtype, sep: int,
                    vocab_size: int, workers: int, tokeniser: type = ShardTokeniser,
                    progress: bool = True) -> tuple[list[np.ndarray], int]:
    """Token streams of ``shards`` in shard order (each (n_s,), ``dtype``) and documents kept in total.

    Runs on the connected Ray runtime: an actor pool of ``workers`` actors
    (``tokeniser`` is the callable class, ``ShardTokeniser`` or a subclass).
    """
    import ray

    ray.data.DataContext.get_current().enable_progress_bars = progress
    items = [{"shard": i, "files": json.dumps([[f.location, f.from_directory, f.size] for f in shard])}
             for i, shard in enumerate(shards)]
    dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        tokeniser, batch_size=1, batch_format="numpy", concurrency=workers, num_cpus=1,
        fn_constructor_kwargs={"tokenizer": PortableTokenizer.of(tokenizer), "options": options,
                               "dtype": np.dtype(dtype).name, "sep": sep, "vocab_size": vocab_size})
    streams: dict[int, np.ndarray] = {}
    documents = 0
    for row in dataset.iter_rows():
        if row["error"]:
            name, message = json.loads(row["error"])
            raise getattr(errors, name, errors.DatastoreError)(message)
        streams[int(row["shard"])] = np.frombuffer(row["tokens"], dtype=dtype)
        documents += int(row["documents"])
    return [streams[i] for i in range(len(shards))], documents
