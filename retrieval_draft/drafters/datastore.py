"""Opening a datastore for a model: the checks that pair a store with a model and tokenizer."""

from __future__ import annotations

from pathlib import Path

from retrieval_draft.drafters.base import Drafter
from retrieval_draft.drafters.registry import STORE_DRAFTERS, DraftSources, make_drafters
from retrieval_draft.errors import InvalidInputError, TokenIdOutOfRangeError, TokenizerMismatchError
from retrieval_draft.store.reader import Datastore


def open_checked_store(datastore: str | Path | Datastore, *, vocab_size: int, tokenizer=None, memory=None) -> Datastore:
    """The store to draft from, checked against the model and tokenizer.

    ``datastore``: an opened store, or a path opened through ``memory.stores``
    (default ``PROCESS_MEMORY``: verified once per process and store build).
    ``vocab_size``: the model's vocabulary size; a store with a larger one
    raises TokenIdOutOfRangeError. With ``tokenizer``, its fingerprint must
    equal the store's (TokenizerMismatchError otherwise).
    """
    from retrieval_draft.memory import PROCESS_MEMORY

    memory = memory if memory is not None else PROCESS_MEMORY
    store = datastore if isinstance(datastore, Datastore) else memory.stores.open(datastore)
    if store.vocab_size > vocab_size:
        raise TokenIdOutOfRangeError(
            f"datastore {store.path} has vocabulary size {store.vocab_size}, larger than the model's {vocab_size}"
        )
    if tokenizer is not None and memory.fingerprint(tokenizer) != store.fingerprint:
        raise TokenizerMismatchError(f"datastore {store.path} was built with a different tokenizer than the model's")
    return store


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
