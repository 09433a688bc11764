"""The drafters the runtime reads from an opened datastore."""

from __future__ import annotations

from pathlib import Path

from datastore.store import Datastore
from retrieval_draft.drafters.base import Drafter
from retrieval_draft.drafters.ngram import NgramDrafter
from retrieval_draft.drafters.suffix import SuffixDrafter
from retrieval_draft.errors import InvalidInputError, TokenIdOutOfRangeError, TokenizerMismatchError

DRAFTER_KINDS = {"ngram": NgramDrafter, "suffix": SuffixDrafter}


def datastore_drafters(
    datastore: str | Path | Datastore,
    *,
    vocab_size: int,
    tokenizer=None,
    kinds: tuple[str, ...] = ("ngram", "suffix"),
    memory=None,
) -> list[Drafter]:
    """Checked drafters over a datastore, one per entry of ``kinds``.

    ``datastore``: an opened store, or a path opened through ``memory.stores``
    (default ``PROCESS_MEMORY``: verified once per process and store build).
    ``vocab_size``: the model's vocabulary size; a store with a larger one
    raises TokenIdOutOfRangeError. With ``tokenizer``, its fingerprint must
    equal the store's (TokenizerMismatchError otherwise).
    """
    from retrieval_draft.memory import PROCESS_MEMORY

    memory = memory if memory is not None else PROCESS_MEMORY
    unknown = [kind for kind in kinds if kind not in DRAFTER_KINDS]
    if unknown:
        raise InvalidInputError(f"unknown drafter kind(s) {unknown}; choose from {sorted(DRAFTER_KINDS)}")
    store = datastore if isinstance(datastore, Datastore) else memory.stores.open(datastore)
    fingerprint = memory.fingerprint(tokenizer) if tokenizer is not None else None
    if store.vocab_size > vocab_size:
        raise TokenIdOutOfRangeError(
            f"datastore {store.path} has vocabulary size {store.vocab_size}, larger than the model's {vocab_size}"
        )
    if fingerprint is not None and fingerprint != store.fingerprint:
        raise TokenizerMismatchError(f"datastore {store.path} was built with a different tokenizer than the model's")
    return [DRAFTER_KINDS[kind](store) for kind in kinds]
