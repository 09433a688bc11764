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

import shutil
import time
from pathlib import Path

from retrieval_draft.atomic import temp_dir_next_to
from retrieval_draft.errors import EmptyCorpusError, InvalidInputError, RetrievalDraftError
from retrieval_draft.store.layout import separator_id, shard_name, token_dtype
from retrieval_draft.store.tokenizer import tokenizer_fingerprint, tokenizer_vocab_size
from retrieval_draft_datastore.builder import publish
from retrieval_draft_datastore.index import IndexParams
from retrieval_draft_datastore.out_path import check_out
from retrieval_draft_datastore.ray_build import connect, import_ray, one_line
from retrieval_draft_datastore.ray_tokenise import ShardTokeniser, plan_shards, tokenise_shards
from retrieval_draft_datastore.shard_build import (
    check_shard_tokens, split_shards, write_shard, write_sharded_manifest, write_store_table,
)
from retrieval_draft_datastore.shard_table import count_range
from retrieval_draft_datastore.sources import SourceOptions, plan_files

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
    ray = import_ray()
    check_shard_tokens(shard_tokens)
    if workers is not None and workers < 1:
        raise InvalidInputError("--workers must be >= 1")
    out = check_out(out)
    vocab_size = tokenizer_vocab_size(tokenizer)
    dtype, files = token_dtype(vocab_size), plan_files(sources, options)
    sep = separator_id(dtype)
    if not files:
        raise EmptyCorpusError("the sources hold no files to read")
    started = connect(ray, address, workers)
    tmp = temp_dir_next_to(out)
    try:
        workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        start = time.perf_counter()
        pieces, documents = tokenise_shards(plan_shards(files, workers), tokenizer, options, dtype, sep,
                                            vocab_size, workers, tokeniser, progress)
        if documents == 0:
            raise EmptyCorpusError("the corpus produced no tokens")
        tokenize_seconds = time.perf_counter() - start
        header = {"vocab_size": vocab_size, "fingerprint": tokenizer_fingerprint(tokenizer)}
        start = time.perf_counter()
        records = _write_shards(ray, pieces, tmp, header, params, shard_tokens, sep, workers)
        shard_seconds = time.perf_counter() - start
        start = time.perf_counter()
        count = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(count_range)
        dirs = [tmp / r["dir"] for r in records]
        table = write_store_table(tmp, dirs, vocab_size, dtype, params,
                                  lambda ranges: ray.get([count.remote(dirs, a, b, params) for a, b in ranges]))
        extra = {"engine": f"ray ({workers} workers)", "tokenize_seconds": round(tokenize_seconds, 3),
                 "shards_seconds": round(shard_seconds, 3), "table_seconds": round(time.perf_counter() - start, 3),
                 "table_ranges": table["table_ranges"], "rare_contexts": table["rare_contexts"]}
        manifest = write_sharded_manifest(tmp, records, header, dtype, params, table, extra)
        publish(tmp, out)
        return manifest
    except RetrievalDraftError:
        raise
    except Exception as error:  # Ray wraps worker failures in its own exception types
        raise one_line(error) from error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if started:
            ray.shutdown()
