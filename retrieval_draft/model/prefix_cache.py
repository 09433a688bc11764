"""KV rows of earlier calls' sequences, found again by token prefix (part of ``model``).

A chat's next turn and an editor's next request begin with what the last call read and wrote.
``PrefixCache`` keeps, for one model, the KV rows of recent sequences (prompt and output, each
row's real tokens from position 0, no padding), and a new call asks it for the longest cached
prefix of its prompt, to prefill only the rest (``prefix_reuse``).

An entry is one sequence: its tokens, shape (n,) int64, and every cache layer's rows for
positions 0..n-1, keys (layers, H_kv, n, d_k) and values (layers, H_kv, n, d_v) in the model's
dtype and device. Lookup is a longest-common-prefix scan over the entries (a few dozen at most
under a laptop's cap: microseconds against a forward's milliseconds). Storing a sequence drops
every entry it covers: one whose rows it holds all of, or all but a short tail (``covered``: at
most ``SPARE_TAIL`` tokens and a quarter of the entry, such as an editor's completion the user
typed past, or a chat reply tokenized again), so a session keeps one entry per branch (an edit
starts one), not one per request. The cache holds at most ``capacity`` bytes of
tensors (keys and values; the token arrays are not counted): storing evicts the least recently
used entries first, and a sequence longer than the whole cap keeps its first rows that fit.

Rows are tied to the weights that computed them: ``weights_signature`` (each parameter's and
buffer's storage and in-place version counter) is checked at every lookup and store, and a
change (an optimiser step, ``load_state_dict``, ``.to(dtype)``) empties the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from retrieval_draft.config import DEFAULTS

SPARE_TAIL = 64  # tokens of an entry's tail a newer sequence may lack and still replace it (re-read: ~0.1 s)


@dataclass
class CachedPrefix:
    """One stored sequence.

    Attributes:
        tokens: (n,) int64, the sequence's real tokens from position 0.
        keys: (layers, H_kv, n, d_k), the rows of every cache layer, position k at index k.
        values: (layers, H_kv, n, d_v).
        used: the cache's clock when last stored or found (least recently used goes first).
    """

    tokens: np.ndarray
    keys: torch.Tensor
    values: torch.Tensor
    used: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the storage its tensors hold (more than their own size where they are views
        of a larger buffer, ``prefix_reuse``'s hand-off of a call's pool)."""
        return self.keys.untyped_storage().nbytes() + self.values.untyped_storage().nbytes()

    @property
    def row_bytes(self) -> int:
        """Bytes one position takes (keys and values of every layer)."""
        return (self.keys.nbytes + self.values.nbytes) // max(1, self.tokens.shape[0])


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens the 1-D arrays ``a`` and ``b`` share."""
    n = min(a.shape[0], b.shape[0])
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.shape[0] else n


def covered(entry: np.ndarray, tokens: np.ndarray) -> bool:
    """Whether ``tokens`` holds all of ``entry`` (both 1-D) but at most a short tail: ``SPARE_TAIL``
    tokens and a quarter of the entry."""
    n = entry.shape[0]
    return common_prefix(entry, tokens) >= n - min(SPARE_TAIL, n // 4)


def weights_signature(model: torch.nn.Module) -> int:
    """A hash of every parameter's and buffer's storage address, shape and version counter:
    changes when any of them is written in place or replaced (~0.1 ms for 300 tensors)."""
    tensors = [*model.parameters(), *model.buffers()]
    return hash(tuple((t.data_ptr(), tuple(t.shape), t._version) for t in tensors))


class PrefixCache:
    """Earlier sequences' KV rows for one model, by token prefix, at most ``capacity`` bytes.

    ``capacity``: bytes (default ``DEFAULTS.prefix_cache_bytes``; SmolLM2-135M's rows take 45 KiB
    a token in float32). Not thread-safe by itself: the plugin uses it under the model's lock.
    """

    def __init__(self, capacity: int = DEFAULTS.prefix_cache_bytes) -> None:
        self.capacity = int(capacity)
        self.entries: list[CachedPrefix] = []
        self.signature: int | None = None
        self._clock = 0

    @property
    def nbytes(self) -> int:
        """Bytes held (keys and values of every entry)."""
        return sum(entry.nbytes for entry in self.entries)

    def clear(self) -> None:
        """Forget every entry."""
        self.entries = []

    def resize(self, capacity: int) -> None:
        """Hold at most ``capacity`` bytes from now on (0 empties it), evicting the least recently used."""
        self.capacity = int(capacity)
        self._evict(0)

    def check(self, signature: int) -> None:
        """Empty the cache when the weights' ``signature`` (``weights_signature``) is not the one
        its rows were computed with."""
        if signature != self.signature:
            self.clear()
            self.signature = signature

    def find(self, tokens: np.ndarray, limit: int) -> tuple[CachedPrefix | None, int]:
        """The entry sharing the longest prefix with ``tokens`` (shape (n,) int64) and that
        prefix's length, at most ``limit`` tokens; (None, 0) when nothing is shared. A hit
        counts as a use."""
        best, length = None, 0
        for entry in self.entries:
            shared = min(common_prefix(entry.tokens, tokens), limit)
            if shared > length:
                best, length = entry, shared
        if best is not None:
            self._clock += 1
            best.used = self._clock
        return best, length

    def store(self, tokens: np.ndarray, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keep a sequence: ``tokens`` (n,) int64 and its rows, keys (layers, H_kv, n, d_k) and
        values (layers, H_kv, n, d_v), which the cache owns from here on (pass copies).

        Entries it ``covered`` are dropped; when an entry already extends ``tokens`` it is marked
        used instead. Past the cap, least recently used entries go first; a sequence bigger than
        the cap keeps its first rows that fit (none when the cap is 0)."""
        n = tokens.shape[0]
        if n == 0 or self.capacity <= 0:
            return
        self._clock += 1
        for entry in self.entries:
            if entry.tokens.shape[0] >= n and common_prefix(entry.tokens, tokens) == n:
                entry.used = self._clock
                return
        self.entries = [e for e in self.entries if not covered(e.tokens, tokens)]
        entry = CachedPrefix(tokens.copy(), keys, values, self._clock)
        if entry.nbytes > self.capacity:
            fit = self.capacity // entry.row_bytes
            if fit == 0:
                return
            entry = CachedPrefix(tokens[:fit].copy(), keys[:, :, :fit].clone(), values[:, :, :fit].clone(), self._clock)
        self._evict(entry.nbytes)
        self.entries.append(entry)

    def _evict(self, incoming: int) -> None:
        """Drop least recently used entries until ``incoming`` more bytes fit under the cap."""
        self.entries.sort(key=lambda entry: entry.used)
        held = self.nbytes
        while self.entries and held + incoming > self.capacity:
            held -= self.entries.pop(0).nbytes
