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

import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from retrieval_draft.atomic import temp_dir_next_to
from retrieval_draft.errors import DatastoreError, EmptyCorpusError, InvalidInputError, RetrievalDraftError
from retrieval_draft.store.layout import separator_id, token_dtype
from retrieval_draft.store.tokenizer import tokenizer_fingerprint, tokenizer_vocab_size
from retrieval_draft_datastore.builder import publish, store_manifest
from retrieval_draft_datastore.index import IndexParams, write_parts
from retrieval_draft_datastore.out_path import check_out
from retrieval_draft_datastore.ray_index import index_on_ray
from retrieval_draft_datastore.ray_tokenise import ShardTokeniser, plan_shards, tokenise_shards
from retrieval_draft_datastore.sources import SourceOptions, plan_files


def import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise InvalidInputError("--engine ray needs Ray Data: pip install 'ray[data]>=2.40'") from None
    return ray


# What ``ray.init(address=...)`` takes: auto, local, HOST:PORT, or a ray:// (Ray Client) or http(s):// address.
RAY_ADDRESS = re.compile(r"auto|local|(?:(?:ray|https?)://)?[^\s:/]+:\d{1,5}")


def check_address(address: str | None) -> None:
    """InvalidInputError for an ``--address`` Ray cannot take (checked before anything loads or connects:
    Ray retries a malformed or unreachable address for minutes)."""
    if address is not None and not RAY_ADDRESS.fullmatch(address):
        raise InvalidInputError(f"--address {address!r} is not a Ray address: give HOST:PORT, "
                                "ray://HOST:PORT, auto or local")


def connect(ray, address: str | None, workers: int | None) -> bool:
    """Join the runtime at ``address``, or the one this process already has, or start a local one
    with ``workers`` CPUs. Returns whether we started it (and so must stop it); DatastoreError
    (one line) when Ray cannot start or join it."""
    if ray.is_initialized():
        return False
    check_address(address)
    kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": True,
              "logging_level": "ERROR"}
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=workers, **kwargs)
    except Exception as error:  # Ray raises ConnectionError, ValueError, RuntimeError, ...
        raise one_line(error) from error
    return True


def one_line(error: BaseException) -> RetrievalDraftError:
    """Our own typed error if a worker raised one, else a DatastoreError with the first line of the cause."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RetrievalDraftError):
            return current
        current = getattr(current, "cause", None) or current.__cause__
    first = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return DatastoreError(f"ray build failed: {first.strip()}")


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
    ray = import_ray()
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
        streams, documents = tokenise_shards(plan_shards(files, workers), tokenizer, options, dtype, sep,
                                             vocab_size, workers, tokeniser, progress)
        streams = [s for s in streams if s.size]
        if documents == 0:
            raise EmptyCorpusError("the corpus produced no tokens")
        tokens = np.concatenate(streams)
        tokenize_seconds = time.perf_counter() - start
        if progress:
            print(f"indexing {tokens.size} tokens on ray", file=sys.stderr)
        start = time.perf_counter()
        sa, parts, sizes = index_on_ray(tokens, [s.size for s in streams], vocab_size, sep, params,
                                        ranges or 2 * workers, progress)
        index_seconds = time.perf_counter() - start
        stats = write_parts(tmp, tokens, sa, parts, sizes, vocab_size, params)
        stats["index_seconds"] = {"sort_count": round(index_seconds, 3), **stats["index_seconds"]}
        header = {"vocab_size": vocab_size, "fingerprint": tokenizer_fingerprint(tokenizer), "documents": documents}
        extra = {"tokenize_seconds": round(tokenize_seconds, 3), "engine": f"ray ({workers} workers)"}
        manifest = store_manifest(tmp, tokens, header, params, stats, extra)
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
