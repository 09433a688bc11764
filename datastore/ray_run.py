"""What every Ray build shares: starting or joining the runtime, and one run's set-up and clean-up.

``ray_run`` checks what a build can check before Ray starts (the workers, ``--out``, the sources),
joins or starts the runtime, gives the build a temp directory next to ``out`` and, however the
build ends, removes it and stops a runtime it started; a failure inside Ray comes out as one typed
line (``one_line``). ``ray_build`` (a flat store) and ``ray_shards`` (a sharded one) run inside it.
"""

from __future__ import annotations

import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from retrieval_draft.atomic import temp_dir_next_to
from retrieval_draft.errors import DatastoreError, InvalidInputError, RetrievalDraftError
from retrieval_draft.store.layout import separator_id, token_dtype
from retrieval_draft.store.tokenizer import tokenizer_vocab_size
from retrieval_draft_datastore.out_path import check_out
from retrieval_draft_datastore.sources import SourceOptions, empty_corpus, plan_files


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


@dataclass(frozen=True)
class RayRun:
    """One Ray build's inputs once checked: the runtime, where the store goes, its scratch folder,
    the vocabulary and stream dtype, the files to read and the number of workers."""

    ray: object
    out: Path
    tmp: Path
    vocab_size: int
    dtype: np.dtype
    separator: int
    files: list
    workers: int


@contextmanager
def ray_run(sources: list[str], options: SourceOptions, out: Path, tokenizer, address: str | None,
            workers: int | None) -> Iterator[RayRun]:
    """Check, start (or join) Ray, yield the run; clean up however it ends (module docstring).
    InvalidInputError (no Ray, bad workers or ``out``), EmptyCorpusError (no files),
    DatastoreError (Ray failed), before or after the build's own work."""
    ray = import_ray()
    if workers is not None and workers < 1:
        raise InvalidInputError("--workers must be >= 1")
    out = check_out(out)
    vocab_size = tokenizer_vocab_size(tokenizer)
    dtype, files = token_dtype(vocab_size), plan_files(sources, options)
    if not files:
        raise empty_corpus(sources, options)
    started = connect(ray, address, workers)
    tmp = temp_dir_next_to(out)
    try:
        workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        yield RayRun(ray, out, tmp, vocab_size, dtype, separator_id(dtype), files, workers)
    except RetrievalDraftError:
        raise
    except Exception as error:  # Ray wraps worker failures in its own exception types
        raise one_line(error) from error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if started:
            ray.shutdown()
