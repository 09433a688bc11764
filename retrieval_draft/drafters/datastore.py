"""Opening datastores for a model: the checks that pair stores with a model and tokenizer.

``datastore=`` takes one store or several (a list or tuple: e.g. a repository's store
beside a general one); ``store_specs`` checks its shape before anything is opened.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from retrieval_draft.draft import Drafter
from retrieval_draft.drafters.registry import STORE_DRAFTERS, DraftSources, make_drafters
from retrieval_draft.errors import InvalidInputError, TokenIdOutOfRangeError, TokenizerMismatchError
from retrieval_draft.store.reader import Datastore
from retrieval_draft.store.sharded import ShardedDatastore

OpenStore = (Datastore, ShardedDatastore)  # what opening a store's directory gives: flat or sharded


def open_checked_store(datastore: str | Path | Datastore | ShardedDatastore, *, vocab_size: int, tokenizer=None,
                       memory=None) -> Datastore | ShardedDatastore:
    """The store to draft from, checked against the model and tokenizer.

    ``datastore``: an opened store, or a path opened through ``memory.stores``
    (default ``PROCESS_MEMORY``: verified once per process and store build).
    ``vocab_size``: the model's vocabulary size; a store with a larger one
    raises TokenIdOutOfRangeError. With ``tokenizer``, its fingerprint must
    equal the store's (TokenizerMismatchError otherwise).
    """
    from retrieval_draft.sessions.memory import PROCESS_MEMORY

    memory = memory if memory is not None else PROCESS_MEMORY
    store = datastore if isinstance(datastore, OpenStore) else memory.stores.open(datastore)
    if store.vocab_size > vocab_size:
        raise TokenIdOutOfRangeError(
            f"datastore {store.path} has vocabulary size {store.vocab_size}, larger than the model's {vocab_size}: "
            f"it was built with another tokenizer; {_rebuild_hint(store.path)}"
        )
    if tokenizer is not None and memory.fingerprint(tokenizer) != store.fingerprint:
        raise TokenizerMismatchError(
            f"datastore {store.path} was built with a different tokenizer than the model's; {_rebuild_hint(store.path)}"
        )
    return store


def _rebuild_hint(path) -> str:
    """What to do with the store at ``path`` built with another tokenizer than the model's."""
    return f"rebuild it with the model's: `retrieval-draft build SOURCES --out {path} --model <the model>`"


StoreSpec = str | os.PathLike | Datastore | ShardedDatastore  # a store's directory, or a store already opened


def store_specs(datastore) -> list[StoreSpec]:
    """``datastore=`` (one spec, or a non-empty list / tuple of them) as a list of specs.

    Raises InvalidInputError for an empty list, an item of another type, or one store named
    twice (by resolved path), and DatastoreNotFoundError for a path that holds no store (a few
    ``stat`` calls): all before any store is opened, which for a large store takes seconds.
    """
    from retrieval_draft.store.store_cache import store_identity

    items = list(datastore) if isinstance(datastore, (list, tuple)) else [datastore]
    if not items:
        raise InvalidInputError("datastore= is an empty list; give a datastore path (or several), or leave it out")
    seen = set()
    for item in items:
        if not isinstance(item, (str, os.PathLike, *OpenStore)):
            raise InvalidInputError(
                f"datastore= takes a datastore path, an opened store, or a list of them; got {type(item).__name__}"
            )
        where = os.path.realpath(item.path if isinstance(item, OpenStore) else item)
        if where in seen:
            raise InvalidInputError(f"datastore= names the store {where} twice")
        seen.add(where)
    for item in items:
        if not isinstance(item, OpenStore):
            store_identity(item)  # raises DatastoreNotFoundError for a missing store
    return items


def open_checked_stores(datastore, *, vocab_size: int, tokenizer=None, memory=None) -> tuple[Datastore, ...]:
    """Every store ``datastore=`` names (``store_specs``), each checked by ``open_checked_store``,
    in the given order."""
    specs = store_specs(datastore)
    return tuple(open_checked_store(spec, vocab_size=vocab_size, tokenizer=tokenizer, memory=memory) for spec in specs)


def datastore_drafters(
    datastore: str | Path | Datastore,
    *,
    vocab_size: int,
    tokenizer=None,
    kinds: tuple[str, ...] = STORE_DRAFTERS,
    memory=None,
) -> list[Drafter]:
    """The registry's store drafters named in ``kinds`` over a checked store (``open_checked_store``)."""
    unknown = [kind for kind in kinds if kind not in STORE_DRAFTERS]
    if unknown:
        raise InvalidInputError(f"unknown drafter kind(s) {unknown}; choose from {list(STORE_DRAFTERS)}")
    store = open_checked_store(datastore, vocab_size=vocab_size, tokenizer=tokenizer, memory=memory)
    return make_drafters(kinds, DraftSources(store=store))


def compile_store_drafters(store: Datastore | ShardedDatastore) -> None:
    """Run every store drafter once on ``store``'s own opening tokens.

    The query kernels are Numba functions cached on disk per argument types (uint16 or uint32
    token streams): compiled in the first ``generate`` that drafts from a store, they cost that
    call ~7 s on a 2-core CPU (``tools.bench.first_call`` with an empty Numba cache: 10.2 s against
    2.7 s, plain ``generate`` 3.5 s). The store builder calls this after each build, so the
    compilation falls in the build instead.
    """
    context = np.asarray(store.shards[0].tokens[:16], dtype=np.int64)
    for drafter in make_drafters(STORE_DRAFTERS, DraftSources(store=store)):
        drafter.propose(context, 8)
