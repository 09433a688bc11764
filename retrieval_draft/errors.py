"""Typed errors. The CLI prints ``str(error)`` as one line and exits non-zero."""


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun`` for a message, plural unless ``count`` is 1: "1 row", "2 rows"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


class RetrievalDraftError(Exception):
    """Base of every error this project raises on purpose."""


class InvalidInputError(RetrievalDraftError, ValueError):
    """A bad argument: empty prompt, max_new_tokens < 1, batch > 1, prompt too long."""


class ModelLoadError(RetrievalDraftError):
    """The model path does not exist or does not hold a loadable causal LM."""


class UnsupportedModelError(RetrievalDraftError):
    """The model cannot score a token tree (no 4D attention mask support)."""


class NoFillInMiddleError(UnsupportedModelError):
    """The model's tokenizer has no fill-in-the-middle tokens, so an infill request cannot be laid out."""


class DatastoreError(RetrievalDraftError):
    """Base of datastore errors."""


class DatastoreNotFoundError(DatastoreError, FileNotFoundError):
    """No datastore exists at the path given (nothing there, or a file where a store's folder was expected)."""


class CorruptDatastoreError(DatastoreError):
    """A datastore file is missing, truncated, or fails its checksum or structure check."""


class TokenizerMismatchError(DatastoreError):
    """The datastore was built with another tokenizer than the model in use."""


class UnknownFormatVersionError(DatastoreError):
    """The manifest names a format version this code cannot read."""


class TokenIdOutOfRangeError(DatastoreError):
    """A token id is outside the vocabulary of the model or datastore."""


class EmptyCorpusError(DatastoreError):
    """The corpus produced no tokens."""


class CorruptHistoryError(RetrievalDraftError):
    """A saved output-history file is unreadable, truncated or malformed."""


class CorruptRecyclingTableError(RetrievalDraftError):
    """A saved logits-recycling table is unreadable, truncated, malformed or for another vocabulary."""
