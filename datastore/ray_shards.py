"""``retrieval-draft build --engine ray --shard-tokens N``: a sharded store built on Ray.

Stage 1 tokenises runs of files on an actor pool (``ray_tokenise``). The
driver cuts the token stream into shards with the local build's rule
(``shard_build.split_shards``), handing each shard to a Ray task as soon as it
is cut and dropping its own copy of the pieces it consumed; the task indexes
the shard and writes its directory (``shard_build.write_shard``), so no process
ever holds more than one shard's suffix array, and every shard is
byte-identical to the local build's. Stage 3 counts the corpus's n-gram table,
one task per first-token range reading the written shards memory-mapped
(``shard_table``); the driver writes the table and the manifest. On a cluster
the output directory must be on a filesystem every node sees.
"""

from __future__ import annotations

import time
from pathlib import Path

from retrieval_draft.store.layout import shard_name
from retrieval_draft.store.tokenizer import tokenizer_fingerprint
from retrieval_draft_datastore.builder import publish
from retrieval_draft_datastore.index import IndexParams
from retrieval_draft_datastore.ray_run import ray_run
from retrieval_draft_datastore.ray_tokenise import ShardTokeniser, plan_shards, tokenise_shards
from retrieval_draft_datastore.shard_build import (
    check_shard_tokens, split_shards, write_shard, write_sharded_manifest, write_store_table,
)
from retrieval_draft_datastore.shard_table import count_range
from retrieval_draft_datastore.sources import SourceOptions, empty_corpus

TASK_RETRIES = 3


def _consumed(pieces: list):
    """Yield the pieces in order, dropping the list's reference to each as it is taken."""
    for i in range(len(pieces)):
        piece, pieces[i] = pieces[i], None
        yield piece


def _write_shards(ray, pieces: list, tmp: Path, header: dict, params: IndexParams, shard_tokens: int,
                  sep: int, workers: int) -> list[dict]:
    """One Ray task per shard, at most ``workers`` in flight; the shards' records in order."""
    task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(write_shard)
    refs, pending = [], []
    for i, tokens in enumerate(split_shards(_consumed(pieces), shard_tokens, sep)):
        if len(pending) >= workers:
            _, pending = ray.wait(pending, num_returns=1)
        ref = task.remote(tmp / shard_name(i), tokens, header, params)
        refs.append(ref)
        pending.append(ref)
        del tokens
    return [record for record, _ in ray.get(refs)]


def build_sharded_ray(sources: list[str], out: Path, tokenizer, shard_tokens: int, *,
                      options: SourceOptions = SourceOptions(), params: IndexParams = IndexParams(),
                      address: str | None = None, workers: int | None = None, progress: bool = True,
                      tokeniser: type = ShardTokeniser) -> dict:
    """Build a sharded store at ``out`` on Ray (module docstring); returns its manifest.

    Raises InvalidInputError (no Ray, bad sources or shard size), EmptyCorpusError,
    DatastoreError (the runtime failed); ``out`` is untouched on any failure (``check_out``
    refuses one that is not ours to replace, before the runtime starts).
    """
    check_shard_tokens(shard_tokens)
    with ray_run(sources, options, out, tokenizer, address, workers) as run:
        start = time.perf_counter()
        pieces, documents = tokenise_shards(plan_shards(run.files, run.workers), tokenizer, options, run.dtype,
                                            run.separator, run.vocab_size, run.workers, tokeniser, progress)
        if documents == 0:
            raise empty_corpus(sources, options)
        tokenize_seconds = time.perf_counter() - start
        header = {"vocab_size": run.vocab_size, "fingerprint": tokenizer_fingerprint(tokenizer)}
        start = time.perf_counter()
        records = _write_shards(run.ray, pieces, run.tmp, header, params, shard_tokens, run.separator, run.workers)
        shard_seconds = time.perf_counter() - start
        start = time.perf_counter()
        count = run.ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(count_range)
        dirs = [run.tmp / r["dir"] for r in records]
        table = write_store_table(run.tmp, dirs, run.vocab_size, run.dtype, params,
                                  lambda ranges: run.ray.get([count.remote(dirs, a, b, params) for a, b in ranges]))
        extra = {"engine": f"ray ({run.workers} workers)", "tokenize_seconds": round(tokenize_seconds, 3),
                 "shards_seconds": round(shard_seconds, 3), "table_seconds": round(time.perf_counter() - start, 3),
                 "table_ranges": table["table_ranges"], "rare_contexts": table["rare_contexts"]}
        manifest = write_sharded_manifest(run.tmp, records, header, run.dtype, params, table, extra)
        publish(run.tmp, run.out)
        return manifest
