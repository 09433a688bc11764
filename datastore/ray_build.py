"""``retrieval-draft build --engine ray``: the datastore build on Ray Data (local or a cluster).

Same inputs, same store: the stream is the single-process stream (shards
are runs of whole files tokenised in order, ``ray_tokenise``), and the
suffix array and counts come from the same kernels run per shard and per
key range (``ray_index``), so every data file is byte-identical to the
single-process build's. The manifest differs only in timings
(``tokenize_seconds``, ``index_seconds``) and in ``stats.engine``.

The store is written as today: into a temp directory next to ``out``,
renamed into place only when complete, so a build that fails leaves the
old store untouched and raises one typed error line.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from retrieval_draft.store.tokenizer import tokenizer_fingerprint
from retrieval_draft_datastore.builder import publish, store_manifest
from retrieval_draft_datastore.index import IndexParams, write_parts
from retrieval_draft_datastore.ray_index import index_on_ray
from retrieval_draft_datastore.ray_run import ray_run
from retrieval_draft_datastore.ray_tokenise import ShardTokeniser, plan_shards, tokenise_shards
from retrieval_draft_datastore.sources import SourceOptions, empty_corpus


def build_ray(sources: list[str], out: Path, tokenizer, *, options: SourceOptions = SourceOptions(),
              params: IndexParams = IndexParams(), address: str | None = None, workers: int | None = None,
              ranges: int | None = None, progress: bool = True, tokeniser: type = ShardTokeniser) -> dict:
    """Build a datastore at ``out`` on Ray; returns its manifest (see the module docstring).

    ``workers``: actors tokenising at once (default: the runtime's CPUs);
    ``ranges``: first-token ranges counted apart (default 2 per worker).
    Raises InvalidInputError (no Ray, bad sources), EmptyCorpusError,
    DatastoreError (the runtime failed); ``out`` is untouched on any failure (``check_out``
    refuses one that is not ours to replace, before the runtime starts).
    """
    with ray_run(sources, options, out, tokenizer, address, workers) as run:
        start = time.perf_counter()
        streams, documents = tokenise_shards(plan_shards(run.files, run.workers), tokenizer, options, run.dtype,
                                             run.separator, run.vocab_size, run.workers, tokeniser, progress)
        streams = [s for s in streams if s.size]
        if documents == 0:
            raise empty_corpus(sources, options)
        tokens = np.concatenate(streams)
        tokenize_seconds = time.perf_counter() - start
        if progress:
            print(f"indexing {tokens.size} tokens on ray", file=sys.stderr)
        start = time.perf_counter()
        sa, parts, sizes = index_on_ray(tokens, [s.size for s in streams], run.vocab_size, run.separator, params,
                                        ranges or 2 * run.workers, progress)
        index_seconds = time.perf_counter() - start
        stats = write_parts(run.tmp, tokens, sa, parts, sizes, run.vocab_size, params)
        stats["index_seconds"] = {"sort_count": round(index_seconds, 3), **stats["index_seconds"]}
        header = {"vocab_size": run.vocab_size, "fingerprint": tokenizer_fingerprint(tokenizer), "documents": documents}
        extra = {"tokenize_seconds": round(tokenize_seconds, 3), "engine": f"ray ({run.workers} workers)"}
        manifest = store_manifest(run.tmp, tokens, header, params, stats, extra)
        publish(run.tmp, run.out)
        return manifest
