"""The prefix cache of the editor loop: KV rows of earlier calls found again by token prefix (part of ``model``).

A chat's next turn and an editor's next request begin with what the last call read and wrote.
``PrefixCache`` keeps, for one model, the KV rows of recent sequences (prompt and output, each
row's real tokens from position 0, no padding); ``PluginMemory`` holds it between calls. One call
uses it through a ``PrefixReuse``, which the call's ``TreeModel`` owns (``TreeModel.start_reuse``)
and calls: before the prefill, ``plan`` finds per row the longest prefix of its real tokens whose
rows are known (in the cache, or in a cache the caller prefilled and passed to ``generate``, HF's
idiom: ``given_cache``), and lays out the slots of a prefill over the rest; while decoding,
``retiring`` takes the rows of a row that leaves the batch; after it, ``finish`` keeps every row's
sequence and extends a caller's one-row cache as HF's ``generate`` would. The rows themselves are
read and written by the tree model (``TreeModel.kept_rows``, ``kv_cache.seeded_cache``).

- slots: row i's m_i reused rows end at slot P = max m_i, its q_i new tokens end at slot
  P + W (W = max q_i); slots in between are dead (hidden, never kept). One unpadded row (or
  rows alike) leaves no gap: the slots are dense and the model's own causal mask applies;
  otherwise a 4D mask says which slots each new token sees (``AttentionLayout.masks``, with
  sliding windows and chunks). Position ids count real tokens, as in a one-shot prefill.
  At least the last prompt token is always run, so the prefill yields the first logits.

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
buffer's storage and in-place version counter) is checked at every call, and a change (an
optimiser step, ``load_state_dict``, ``.to(dtype)``) empties the cache.

A caller's cache (``model.generate(..., past_key_values=prompt_cache, custom_generate=retrieval_draft.generate)``)
reaches our callable in ``model_kwargs`` (``cache`` from transformers 5.24, ``past_key_values``
before). It holds the rows of the first n columns of ``input_ids`` (left padding included); row
i starts from its real tokens among them (at most all but its last token) and takes precedence
over the model's cache. A one-row call then extends it with the rows of every token but the last,
so a chat can pass the same cache turn after turn; a batch's cache is read, not extended (HF's
would also hold rows of the padding after rows that stopped early, which we never compute).
Caches we cannot read as whole rows raise ``InvalidInputError`` before any forward: other
classes than ``DynamicCache``, sliding-window layers that dropped rows, a batch size or row
count that does not fit the prompt.

Exactness: a reused row was computed by another forward (other row counts in the matmuls,
another blocking in attention), so it may differ from a one-shot prefill's in the last bits;
greedy outputs part only where the model's two best tokens are that close
(``tools.bench.exactness.first_divergence``); ``prefix_cache_bytes=0`` gives the strict path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch
from transformers import DynamicCache

from retrieval_draft.config import DEFAULTS
from retrieval_draft.errors import InvalidInputError, counted
from retrieval_draft.model.attention_layout import CHAIN

CACHE_KWARGS = ("cache", "past_key_values")  # transformers 5.24's name first, then the older one
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
        of a larger buffer, ``TreeModel.kept_rows``' hand-off of a call's pool)."""
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


@dataclass(frozen=True)
class RowSeed:
    """Known rows of one batch row: positions 0..count-1 of keys (layers, H_kv, >= count, d_k)
    and values (layers, H_kv, >= count, d_v)."""

    keys: torch.Tensor
    values: torch.Tensor
    count: int


@dataclass(frozen=True)
class ReuseReport:
    """What one call's prefill reused (``DecodeStats`` reports it).

    Attributes:
        reused: tokens whose KV rows came from earlier calls or the caller's cache, all rows.
        prefilled: prompt tokens the prefill ran, all rows.
        note: why rows could not be reused or kept (reuse off, a cache layout), else None.
    """

    reused: int = 0
    prefilled: int = 0
    note: str | None = None


def layout_blocker(layout, rows: int) -> str | None:
    """Why a call with this attention ``layout`` and ``rows`` rows can start from no known rows, or None."""
    if layout.own_cache_kinds:
        return f"its cache layers ({', '.join(layout.own_cache_kinds)}) keep per-token state besides KV rows"
    if rows > 1 and layout.mode == CHAIN:
        return f"a batch's reused rows need a 4D mask, and this model verifies chains ({layout.chain_reason})"
    return None


def given_cache(model_kwargs: dict):
    """The cache the caller passed to ``generate`` (under either name), or None. A cache that
    ``generate`` made itself (empty, and not marked ``_is_user_defined`` as transformers marks
    the caller's) is None too."""
    for name in CACHE_KWARGS:
        cache = model_kwargs.get(name)
        if cache is None or not (getattr(cache, "_is_user_defined", False) or int(cache.get_seq_length()) > 0):
            continue  # none, or generate's own (a StaticCache for cache_implementation="static", say)
        if not isinstance(cache, DynamicCache):
            raise InvalidInputError(
                f"{name}= takes a DynamicCache holding the prompt's first tokens; got {type(cache).__name__}"
            )
        return cache
    return None


def given_seeds(cache: DynamicCache, input_ids: torch.Tensor, mask: torch.Tensor) -> list[RowSeed | None]:
    """Per row of the left-padded (B, L) batch (``mask`` 1 on real tokens), the cache's rows of
    its real tokens, keys (layers, H_kv, m_i, d_k) and values; None where it holds none."""
    rows, length = input_ids.shape
    held = cache.get_seq_length()
    if held == 0:
        return [None] * rows
    layers = [layer for layer in cache.layers if getattr(layer, "keys", None) is not None and layer.keys.numel()]
    if held >= length + 1:
        raise InvalidInputError(f"the cache passed to generate holds {held} tokens, more than the prompt's {length}")
    if any(layer.keys.shape[0] != rows for layer in layers):
        held_rows = counted(layers[0].keys.shape[0], "row")
        raise InvalidInputError(f"the cache passed to generate holds {held_rows}; the prompt has {rows}")
    if any(layer.keys.shape[-2] != held for layer in layers) or len(layers) != len(cache.layers):
        raise InvalidInputError(
            "the cache passed to generate does not hold every row of its tokens in every layer (a sliding-window "
            "layer drops old rows): pass a DynamicCache() made without a config"
        )
    real = mask.sum(dim=1).tolist()
    seeds: list[RowSeed | None] = []
    for row in range(rows):
        start = length - real[row]
        count = min(held - start, real[row] - 1)
        if count <= 0:
            seeds.append(None)
            continue
        keys = torch.stack([layer.keys[row, :, start : start + count] for layer in layers])
        values = torch.stack([layer.values[row, :, start : start + count] for layer in layers])
        seeds.append(RowSeed(keys, values, count))
    return seeds


def extend_given(cache: DynamicCache, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Append to a one-row ``cache`` the rows it lacks of the sequence whose rows are ``keys``
    (layers, H_kv, n, d_k) and ``values`` (layers, H_kv, n, d_v): it then holds n tokens, as HF's
    ``generate`` leaves it."""
    held = cache.get_seq_length()
    for index in range(keys.shape[0]):
        cache.update(keys[index, None, :, held:].contiguous(), values[index, None, :, held:].contiguous(), index)


@dataclass(frozen=True)
class SeededPrefill:
    """The slots of a prefill that starts from known rows (``PrefixReuse.plan``), T = first + width.

    Attributes:
        seeds: per row, its known rows (None: none).
        first: P, the slot after the longest reused prefix (every row's reused rows end there).
        visible: (B, T) bool, which slots hold a row's tokens.
        slot_pos: (B, T) int64, each slot's position.
        tokens: (B, width) int64, the forward's new tokens (dead slots repeat the row's first new one).
        positions: (B, width) int64, their positions.
    """

    seeds: list[RowSeed | None]
    first: int
    visible: np.ndarray
    slot_pos: np.ndarray
    tokens: np.ndarray
    positions: np.ndarray

    @property
    def width(self) -> int:
        """W, the new tokens of the longest row."""
        return self.tokens.shape[1]


class PrefixReuse:
    """One generation's use of ``cache`` (the model's ``PrefixCache``); its ``TreeModel`` owns it.

    ``note``: why this call starts from nothing in ``cache`` (reuse off, a layout), or None.
    ``caller_cache``: a cache the caller passed to ``generate`` (``given_cache``), whose rows
    ``given`` (one seed or None per row, ``given_seeds``) take precedence, or None."""

    def __init__(self, cache: PrefixCache, note: str | None, given: list[RowSeed | None] | None = None,
                 caller_cache=None) -> None:
        self.cache = cache
        self.note = note
        self.given = given
        self.caller_cache = caller_cache
        self.report = ReuseReport(note=note)
        self._origin: list[int] = [0]  # current batch position -> original row (set at the prefill)
        self._retired: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def start(cls, cache: PrefixCache, capacity: int, signature: int | None, blocker: str | None, input_ids: torch.Tensor,
              attention_mask: torch.Tensor, model_kwargs: dict) -> "PrefixReuse":
        """One call's reuse of ``cache``, resized to ``capacity`` bytes (0: off, and emptied) and emptied
        when the weights' ``signature`` (``weights_signature``; None with capacity 0) changed; ``blocker``: why the model's
        layout cannot start from known rows (``layout_blocker``), or None. ``input_ids`` and
        ``attention_mask``: (B, L), left-padded. Raises ``InvalidInputError`` for a caller's cache
        (in ``model_kwargs``) it cannot use."""
        cache.resize(capacity)
        if capacity > 0:
            cache.check(signature)
        note = "prefix reuse is off (prefix_cache_bytes=0)" if capacity <= 0 else blocker
        caller = given_cache(model_kwargs)
        given = None
        if caller is not None:
            given = given_seeds(caller, input_ids.cpu(), attention_mask.cpu().to(torch.long))
            if blocker is not None and any(seed is not None for seed in given):
                raise InvalidInputError(f"the cache passed to generate cannot be used with this model: {blocker}")
        return cls(cache, note, given, caller_cache=caller)

    @property
    def keeps_rows(self) -> bool:
        """Whether rows leaving the batch are worth copying (the cache keeps anything)."""
        return self.cache.capacity > 0

    def seeds(self, input_ids: torch.Tensor, mask: torch.Tensor) -> list[RowSeed | None]:
        """Per row of the left-padded (B, L) batch, the rows to start from (None: none)."""
        rows, length = input_ids.shape
        real = mask.sum(dim=1).tolist()
        if self.given is not None:
            return [s if s is not None and s.count > 0 else None for s in self.given]
        if self.note is not None:
            return [None] * rows
        found = []
        for row in range(rows):
            tokens = input_ids[row, length - real[row]:].numpy()
            entry, count = self.cache.find(tokens, real[row] - 1)
            found.append(RowSeed(entry.keys, entry.values, count) if count else None)
        return found

    def plan(self, input_ids: torch.Tensor, mask: torch.Tensor) -> SeededPrefill | None:
        """The slots of a prefill of the left-padded (B, L) batch (on the host, mask int64) that starts
        from known rows, or None when no row has any (then the model prefills as usual)."""
        rows = input_ids.shape[0]
        real = mask.sum(dim=1).numpy()
        self._origin = list(range(rows))
        seeds = self.seeds(input_ids, mask)
        reused = np.array([s.count if s is not None else 0 for s in seeds], dtype=np.int64)
        self.report = ReuseReport(int(reused.sum()), int((real - reused).sum()), self.note)
        if not reused.any():
            return None
        first, width = int(reused.max()), int((real - reused).max())
        return SeededPrefill(seeds, first, *_layout(input_ids.numpy(), real, reused, first, width))

    def retiring(self, position: int, rows: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Batch row ``position`` is about to leave (the last row takes its place): keep its ``rows``
        (``TreeModel.kept_rows``; None when its cache cannot give them)."""
        if rows is not None:
            self._retired[self._origin[position]] = rows
        self._origin[position] = self._origin[-1]
        self._origin.pop()

    def finish(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, outputs: list[np.ndarray],
               live_rows: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None) -> ReuseReport:
        """After decoding: keep every row's sequence (its real prompt tokens, then ``outputs[i]``, shape
        (m_i,)) in the cache and extend a caller's one-row, unpadded cache. ``live_rows``: a callable
        giving, per batch position, that row's rows (``TreeModel.kept_rows``), or None when the cache's
        layers are not one pool (then nothing is kept and the report says so). Returns the report."""
        mask = attention_mask.cpu().bool()
        extend = self.caller_cache is not None and input_ids.shape[0] == 1 and bool(mask.all())
        if not (self.keeps_rows or extend):
            return self.report
        if live_rows is None:
            self.report = replace(self.report, note=self.report.note or "its cache layers are not all of one shape: rows are not kept")
            return self.report
        rows = dict(self._retired)
        for position, origin in enumerate(self._origin):
            rows[origin] = live_rows(position)
        sequences = [np.concatenate([input_ids[i][mask[i]].cpu().numpy(), out]) for i, out in enumerate(outputs)]
        if self.keeps_rows:
            for origin, (keys, values) in rows.items():
                count = min(sequences[origin].shape[0] - 1, keys.shape[2])
                if count > 0:
                    self.cache.store(sequences[origin][:count], keys[:, :, :count], values[:, :, :count])
        if extend and 0 in rows:
            count = sequences[0].shape[0] - 1
            extend_given(self.caller_cache, rows[0][0][:, :, :count], rows[0][1][:, :, :count])
        return self.report


def _layout(prompts: np.ndarray, real: np.ndarray, reused: np.ndarray, first: int, width: int):
    """Slots of a seeded prefill: visible (B, T) bool, slot_pos (B, T) int64 (T = first + width),
    and the forward's tokens (B, width) and positions (B, width) int64 (dead slots repeat the
    row's first new token at its position)."""
    rows, length = prompts.shape
    total = first + width
    visible = np.zeros((rows, total), dtype=bool)
    slot_pos = np.zeros((rows, total), dtype=np.int64)
    tokens = np.zeros((rows, width), dtype=np.int64)
    positions = np.zeros((rows, width), dtype=np.int64)
    for row in range(rows):
        m, q = int(reused[row]), int(real[row] - reused[row])
        visible[row, first - m : first] = True
        slot_pos[row, first - m : first] = np.arange(m)
        visible[row, total - q :] = True
        slot_pos[row, total - q :] = np.arange(m, m + q)
        tokens[row, width - q :] = prompts[row, length - q :]
        tokens[row, : width - q] = prompts[row, length - q]
        positions[row, width - q :] = np.arange(m, m + q)
        positions[row, : width - q] = m
    return visible, slot_pos, tokens, positions
