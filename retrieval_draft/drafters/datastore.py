"""Open a datastore and return the drafters the runtime asked for."""

from __future__ import annotations

from pathlib import Path

from datastore.store import open_datastore
from datastore.tokenizer import tokenizer_fingerprint
from retrieval_draft.drafters.base import Drafter
from retrieval_draft.drafters.ngram import NgramDrafter
from retrieval_draft.drafters.suffix import SuffixDrafter
from retrieval_draft.errors import InvalidInputError, TokenIdOutOfRangeError, TokenizerMismatchError

DRAFTER_KINDS = {"ngram": NgramDrafter, "suffix": SuffixDrafter}


def datastore_drafters(
    path: str | Path, *, vocab_size: int, tokenizer=None, kinds: tuple[str, ...] = ("ngram", "suffix")
) -> list[Drafter]:
    """Validated drafters over the datastore at ``path``, one per entry of ``kinds``.

    ``vocab_size``: the model's vocabulary size; a store with a larger one
    raises TokenIdOutOfRangeError. With ``tokenizer``, its fingerprint must
    equal the store's (TokenizerMismatchError otherwise).
    """
    unknown = [kind for kind in kinds if kind not in DRAFTER_KINDS]
    if unknown:
        raise InvalidInputError(f"unknown drafter kind(s) {unknown}; choose from {sorted(DRAFTER_KINDS)}")
    store = open_datastore(path)
    if store.vocab_size > vocab_size:
        raise TokenIdOutOfRangeError(
            f"datastore {path} has vocabulary size {store.vocab_size}, larger than the model's {vocab_size}"
        )
    if tokenizer is not None and tokenizer_fingerprint(tokenizer) != store.fingerprint:
        raise TokenizerMismatchError(f"datastore {path} was built with a different tokenizer than the model's")
    return [DRAFTER_KINDS[kind](store) for kind in kinds]
