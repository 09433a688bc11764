"""Learning from outputs: earlier prompts and generations become a draft source.

Every finished generation (its prompt and output, as one document) is
appended to a bounded token buffer; later generations copy from it like
prompt lookup does from the context. Repeated or similar tasks get faster
over time (the idea behind SuffixDecoding's and llama.cpp's dynamic caches).

Memory: at most ``max_tokens`` int32 ids (4 bytes each, 4 MB for the
default million) plus one separator per document, and an index of where each
token occurs (``TokenPositions``, 8 bytes a token), so a step's lookup costs
the same at a million tokens as at a thousand. When full, the oldest half is
evicted at once. Appending a document copies the buffer and merges its ids
into the index: about 1.5 ms at a million ids, once per generation.

The buffer survives restarts with ``save`` and ``load`` (like llama.cpp's
dynamic lookup cache file): one ``.npz`` holding the ids, a format version
and the tokenizer's fingerprint, written atomically.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retrieval_draft.draft import Drafter, Proposals
from retrieval_draft.drafters.tagged_npz import load_tagged, save_tagged
from retrieval_draft.drafters.tail_match import continuations, match_lengths
from retrieval_draft.drafters.token_positions import TokenPositions
from retrieval_draft.errors import CorruptHistoryError, TokenIdOutOfRangeError

SEPARATOR = -1
HISTORY_FORMAT = 1


class HistoryDrafter(Drafter):
    """Drafts from earlier generations of this process (or of whoever shares the instance).

    Args:
        max_tokens: buffer capacity in tokens.
        min_ngram: shortest tail that counts as a match (history is larger
            and noisier than the context, so the default asks for 2).
        max_ngram: longest tail matched.
        max_branches: most continuations per step.
    """

    name = "history"
    # Tail-match rates were measured for copying from the context itself; a match
    # in another document is weaker evidence, so start sceptical (the default).
    prior_scale = 0.5

    def __init__(self, max_tokens: int = 1_000_000, min_ngram: int = 2, max_ngram: int = 32, max_branches: int = 3) -> None:
        if max_tokens < 16:
            raise ValueError("max_tokens must be at least 16")
        self.max_tokens = max_tokens
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.max_branches = max_branches
        self._buffer = np.empty(0, dtype=np.int32)
        self._positions = TokenPositions()  # where each id of ``_buffer`` occurs

    @property
    def size(self) -> int:
        """Tokens held, separators included."""
        return int(self._buffer.shape[0])

    @property
    def tokens(self) -> np.ndarray:
        """(size,) int32: the ids held, oldest first, documents separated by ``SEPARATOR`` (a read-only view)."""
        view = self._buffer.view()
        view.flags.writeable = False
        return view

    def for_row(self, row: int) -> "HistoryRow":
        """A handle that drafts from this history and adds its row's prompt and output to it at the end."""
        return HistoryRow(self)

    def add(self, document: np.ndarray) -> None:
        """Append one document (shape (n,), ids >= 0), evicting the oldest half when full."""
        document = np.asarray(document, dtype=np.int32)[-(self.max_tokens - 1) :]
        grown = np.concatenate([self._buffer, document, [SEPARATOR]]).astype(np.int32)
        self._positions.extend(document, self._buffer.shape[0])
        if grown.shape[0] > self.max_tokens:
            cut = grown.shape[0] - self.max_tokens // 2
            separators = np.flatnonzero(grown[:cut] == SEPARATOR)
            start = int(separators[-1]) + 1 if separators.size else cut
            grown = grown[start:]
            self._positions.drop_before(start)
        self._buffer = grown

    def save(self, path: str | Path, tokenizer=None) -> None:
        """Write the buffer to ``path`` (.npz) atomically; with ``tokenizer``, record its fingerprint."""
        save_tagged(path, {"tokens": self._buffer}, HISTORY_FORMAT, tokenizer)

    @classmethod
    def load(cls, path: str | Path, *, vocab_size: int | None = None, tokenizer=None, **options) -> "HistoryDrafter":
        """A drafter holding the buffer saved at ``path``; ``options`` go to the constructor.

        Raises CorruptHistoryError for an unreadable or malformed file,
        TokenizerMismatchError when ``tokenizer`` differs from the one recorded,
        TokenIdOutOfRangeError for ids >= ``vocab_size``.
        """
        tokens = load_tagged(path, ("tokens",), HISTORY_FORMAT, CorruptHistoryError, "history file", tokenizer)["tokens"]
        if tokens.dtype != np.int32 or tokens.ndim != 1 or (tokens.size and int(tokens.min()) < SEPARATOR):
            raise CorruptHistoryError(f"{path} does not hold a 1-D int32 id buffer")
        if vocab_size is not None and tokens.size and int(tokens.max()) >= vocab_size:
            raise TokenIdOutOfRangeError(f"{path} holds id {int(tokens.max())}, beyond the vocabulary of {vocab_size}")
        drafter = cls(**options)
        drafter._buffer = tokens[-drafter.max_tokens :].copy()
        drafter._positions = TokenPositions.of(drafter._buffer)
        return drafter

    def propose_into(self, context: np.ndarray, max_len: int, out: Proposals) -> None:
        if self._buffer.shape[0] < 2 or not context.shape[0]:
            return
        ends = self._positions.positions(int(context[-1]), below=self._buffer.shape[0] - 1)  # a token follows
        lengths = match_lengths(self._buffer, context, ends, self.max_ngram)
        keep = lengths >= self.min_ngram
        if keep.any():
            continuations(self._buffer, ends[keep], lengths[keep], max_len, self.max_branches, out)


class HistoryRow(Drafter):
    """One row's handle on a shared ``HistoryDrafter``: drafts from the shared buffer, holds its
    own prompt, and adds prompt + output as one document when its generation ends (rows of a
    batch each add their own pair, whatever order they finish in)."""

    def __init__(self, history: HistoryDrafter) -> None:
        self.history = history
        self.name = history.name
        self.prior_scale = history.prior_scale
        self._prompt = np.empty(0, dtype=np.int64)

    def begin(self, prompt: np.ndarray) -> None:
        self._prompt = np.asarray(prompt, dtype=np.int64).copy()

    def propose_into(self, context: np.ndarray, max_len: int, out: Proposals) -> None:
        self.history.propose_into(context, max_len, out)

    def end(self, output: np.ndarray) -> None:
        self.history.add(np.concatenate([self._prompt, np.asarray(output, dtype=np.int64)]))
