"""One call's reuse of earlier KV rows: find them, prefill only the rest, keep the new ones (part of ``model``).

``PrefixReuse`` sits beside a ``TreeModel`` for one generation. Before the prefill it asks,
per row, for the longest prefix of the row's real tokens whose KV rows are known: from the
model's ``PrefixCache`` (earlier calls), or from a cache the caller prefilled and passed to
``generate`` (HF's idiom, ``given_cache``). At least the last prompt token is always run, so
the prefill yields the first logits. The forward then runs only the rest, on a cache seeded
with those rows:

- slots: row i's m_i reused rows end at slot P = max m_i, its q_i new tokens end at slot
  P + W (W = max q_i); slots in between are dead (hidden, never kept). One unpadded row (or
  rows alike) leaves no gap: the slots are dense and the model's own causal mask applies;
  otherwise a 4D mask says which slots each new token sees (``AttentionLayout.masks``, with
  sliding windows and chunks). Position ids count real tokens, as in a one-shot prefill.
- capacity: the prompt plus ``TreeModel.reserve`` positions, so decoding does not regrow the pool.
- chunks: the new tokens run ``PREFILL_CHUNK`` at a time, so attention skips what causality hides
  almost as a one-shot prefill does (on the editor's edit, 2,577 new tokens after 349 reused, one
  forward took 7.5 s where a one-shot prefill of all 2,926 took 6.9 s).

After decoding, ``store`` copies each row's rows (prompt and output, less the last token,
whose row is never computed) into the cache; rows that finished early are copied as they
leave the batch (``retiring``). What could not be reused, and why, is ``note``.

Exactness: a reused row was computed by another forward (other row counts in the matmuls,
another blocking in attention), so it may differ from a one-shot prefill's in the last bits;
greedy outputs part only where the model's two best tokens are that close
(the rule ``tools.bench.exactness.first_divergence`` checks); ``prefix_cache_bytes=0`` gives the strict path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from retrieval_draft.model.attention_layout import CHAIN
from retrieval_draft.model.kv_cache import MIN_CAPACITY, GrowingLayer, KVPool, growing_cache
from retrieval_draft.model.prefix_cache import PrefixCache
from retrieval_draft.model.row_slots import RowSlots
from retrieval_draft.model.skinny_linear import skinny_linears

if TYPE_CHECKING:
    from retrieval_draft.model.tree_model import TreeModel


PREFILL_CHUNK = 512  # new tokens per forward of a seeded prefill (``_forward``)
HANDOFF_SLACK = 0.25  # spare pool positions (a share of the rows) up to which a one-row pool is kept, not copied


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


class PrefixReuse:
    """One generation's use of ``cache`` (the model's ``PrefixCache``).

    ``note``: why this call starts from nothing in ``cache`` (reuse off, a layout), or None.
    ``caller_cache``: a cache the caller passed to ``generate`` (``given_cache``), whose rows
    ``given`` (one seed or None per row, ``given_cache.given_seeds``) take precedence, or None.
    The seeded cache holds the prompt plus ``TreeModel.reserve`` positions per row."""

    def __init__(self, cache: PrefixCache, note: str | None, given: list[RowSeed | None] | None = None,
                 caller_cache=None) -> None:
        self.cache = cache
        self.note = note
        self.given = given
        self.caller_cache = caller_cache
        self.report = ReuseReport(note=note)
        self._origin: list[int] = [0]  # current batch position -> original row (set at the prefill)
        self._retired: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

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

    def prefill(self, model: "TreeModel", input_ids: torch.Tensor, mask: torch.Tensor):
        """The seeded prefill of ``model`` (``TreeModel.prefill``'s inputs on the host, mask as
        int64), or None when no row has rows to start from (then the model prefills as usual).
        Returns the last position's logits, (B, V) float32."""
        rows, length = input_ids.shape
        real = mask.sum(dim=1).numpy()
        self._origin = list(range(rows))
        seeds = self.seeds(input_ids, mask)
        reused = np.array([s.count if s is not None else 0 for s in seeds], dtype=np.int64)
        self.report = ReuseReport(int(reused.sum()), int((real - reused).sum()), self.note)
        if not reused.any():
            return None
        new = real - reused
        first, width = int(reused.max()), int(new.max())
        visible, slot_pos, tokens, positions = _layout(input_ids.numpy(), real, reused, first, width)
        cache, pool = _seeded_cache(seeds, first, first + width + (model.reserve or 0), rows)
        slots = RowSlots(visible, slot_pos)
        out = _forward(model, cache, tokens, positions, visible, slot_pos, slots.dense, first)
        model.cache, model.pools, model.slots = cache, [pool], slots
        return out.logits[:, -1].float()

    def retiring(self, model: "TreeModel", position: int) -> None:
        """Batch row ``position`` is about to leave (the last row takes its place): copy its rows."""
        if self.cache.capacity > 0 and self._storable(model):
            self._retired[self._origin[position]] = _row_rows(model, position)
        self._origin[position] = self._origin[-1]
        self._origin.pop()

    def kept_rows(self, model: "TreeModel") -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """After decoding: original row -> copies of its kept rows in position order, keys
        (layers, H_kv, n, d_k) and values (layers, H_kv, n, d_v) (rows that left early included);
        empty when the cache's layers are not one pool (then ``report.note`` says so)."""
        if not self._storable(model):
            self.report = replace(self.report, note=self.report.note or "its cache layers are not all of one shape: rows are not kept")
            return {}
        rows = dict(self._retired)
        for position, origin in enumerate(self._origin):
            rows[origin] = _row_rows(model, position)
        return rows

    def store(self, rows: dict[int, tuple[torch.Tensor, torch.Tensor]], sequences: list[np.ndarray]) -> None:
        """Keep ``rows`` (``kept_rows``) in the cache: ``sequences[i]`` (n_i,) int64 is original row
        i's real tokens, prompt and output; its first n_i - 1 have rows."""
        for origin, (keys, values) in rows.items():
            count = min(sequences[origin].shape[0] - 1, keys.shape[2])
            if count > 0:
                self.cache.store(sequences[origin][:count], keys[:, :, :count], values[:, :, :count])

    @staticmethod
    def _storable(model: "TreeModel") -> bool:
        """Every cache layer is a ``GrowingLayer`` of one pool (one shape of rows)."""
        layers = model.cache.layers
        return (len(model.pools) == 1 and len(model.pools[0].layers) == len(layers)
                and all(isinstance(layer, GrowingLayer) for layer in layers))


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


def _seeded_cache(seeds: list[RowSeed | None], first: int, capacity: int, rows: int):
    """A cache of ``GrowingLayer``s in one pool of ``capacity`` positions per row, row i's seed
    in slots first - m_i .. first - 1 and zeros before (hidden, but finite)."""
    sample = next(seed for seed in seeds if seed is not None)
    layers, heads, _, key_dim = sample.keys.shape
    capacity = max(capacity, MIN_CAPACITY)
    keys = sample.keys.new_empty((layers, rows, heads, capacity, key_dim))
    values = sample.values.new_empty((layers, rows, heads, capacity, sample.values.shape[-1]))
    for row, seed in enumerate(seeds):
        count = 0 if seed is None else seed.count
        keys[:, row, :, : first - count].zero_()
        values[:, row, :, : first - count].zero_()
        if count:
            keys[:, row, :, first - count : first].copy_(seed.keys[:, :, :count])
            values[:, row, :, first - count : first].copy_(seed.values[:, :, :count])
    cache = growing_cache()
    cache.layers = [GrowingLayer() for _ in range(layers)]
    for layer in cache.layers:
        layer.lazy_initialization(keys[0, :, :, :0], values[0, :, :, :0])
    return cache, KVPool.seeded(cache.layers, keys, values, first)


def _forward(model: "TreeModel", cache, tokens, positions, visible, slot_pos, dense: bool, first: int):
    """The model over the new tokens (B, W) after ``first`` seeded slots, ``PREFILL_CHUNK`` tokens
    per forward (a causal mask over cached rows is a full rectangle that attention cannot skip
    blocks of, so one forward over many new tokens would do nearly twice a one-shot prefill's
    attention); returns the last forward's output (logits of the last position)."""
    width = tokens.shape[1]
    for start in range(0, width, PREFILL_CHUNK):
        end = min(start + PREFILL_CHUNK, width)
        out = _forward_chunk(model, cache, tokens[:, start:end], positions[:, start:end], visible[:, : first + end],
                             slot_pos[:, : first + end], dense, first + start)
    return out


def _forward_chunk(model: "TreeModel", cache, tokens, positions, visible, slot_pos, dense: bool, cached: int):
    """The model over new tokens (B, c) after ``cached`` slots (``visible`` and ``slot_pos``: (B,
    cached + c)): the model's own causal mask where the slots are dense and no layer is windowed
    (or it verifies chains), else a 4D one."""
    layout, device = model.layout, model.device
    rows, width = tokens.shape
    tokens_t, positions_t = torch.from_numpy(tokens).to(device), torch.from_numpy(positions).to(device)
    mask = None
    if dense and layout.windowed and layout.mode != CHAIN:
        among = torch.ones((rows, width, width), dtype=torch.bool, device=device).tril_()
        mask = layout.tree_over_dense_cache(among, cached, positions_t, model.dtype)
    elif not dense:
        slot = np.arange(visible.shape[1])
        allowed = visible[:, None, :] & (slot[None, None, :] <= cached + np.arange(width)[None, :, None])
        dead = ~visible[:, cached:]  # (B, c): a dead slot sees only itself
        allowed[:, np.arange(width), cached + np.arange(width)] |= dead
        mask = layout.masks(torch.from_numpy(allowed).to(device), positions_t, torch.from_numpy(slot_pos).to(device),
                            model.dtype)
    skinny = model._skinny if rows * width in model.skinny_sizes else []
    with torch.no_grad(), skinny_linears(skinny, model.kernel_threads):
        return model.model(
            input_ids=tokens_t,
            **layout.position_kwargs(positions_t),
            **({"attention_mask": mask} if mask is not None else {}),
            **layout.cache_kwargs(cache),
            use_cache=True,
            logits_to_keep=1,
        )


def _row_rows(model: "TreeModel", position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch row ``position``'s kept rows in position order: keys (layers, H_kv, n, d_k) and values
    (layers, H_kv, n, d_v), n = the row's kept tokens. Copies, except for a pool of one row whose
    spare capacity is at most ``HANDOFF_SLACK`` of n: then views of the pool itself (the call is
    over and its model dropped, so nothing writes it again; the cache counts its whole storage)."""
    pool, slots = model.pools[0], model.slots
    count = int(slots.next_pos[position])
    keys, values = pool.keys[:, position], pool.values[:, position]
    if slots.dense and pool.keys.shape[1] == 1 and pool.capacity <= count * (1 + HANDOFF_SLACK):
        return keys[:, :, :count], values[:, :, :count]
    if slots.dense:
        return keys[:, :, :count].clone(), values[:, :, :count].clone()
    index = torch.from_numpy(np.flatnonzero(slots.visible[position])[:count]).to(keys.device)
    return keys.index_select(2, index), values.index_select(2, index)
