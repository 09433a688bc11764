"""A KV cache whose layers write new rows in place instead of concatenating.

HF's ``DynamicLayer`` appends each step's keys and values with ``torch.cat``,
which allocates a new tensor and copies the whole cache, in every layer, on
every forward. On a 2-core CPU with SmolLM2-135M's 30 layers that cost about
1 ms of a 33 ms single-token step after a 256-token prompt and 5.5 ms of 44 ms
after 1,500 tokens (``tools/diagnostics/forward_cost.py``); it grows with the context.

``GrowingLayer`` keeps each layer's rows in a buffer of shape
(batch, kv_heads, capacity, head_dim) and exposes ``keys``/``values`` as the
views ``buffer[..., :length, :]``. An update copies only the new rows; when
the buffer is full it is reallocated at twice the needed length, so memory
stays below twice that of a concatenated cache and copies are amortised.
``TreeModel.keep`` compacts rows inside the same views.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

MIN_CAPACITY = 256  # rows allocated at least, so short prompts do not regrow every few steps


class GrowingLayer(DynamicLayer):
    """One layer's KV rows in a preallocated buffer; ``keys``/``values`` are prefix views of it.

    The number of live rows is ``keys.shape[-2]``: whoever shortens the views
    (``TreeModel.keep`` after verification) shortens the cache.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = self._value_buffer = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write (B, H_kv, n, d) new rows after the live ones; return the (B, H_kv, length, d) views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2] if self._key_buffer is not None else 0
        end = start + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._grow(key_states, value_states, start, max(2 * end, MIN_CAPACITY))
        self._key_buffer[..., start:end, :].copy_(key_states)
        self._value_buffer[..., start:end, :].copy_(value_states)
        self.keys = self._key_buffer[..., :end, :]
        self.values = self._value_buffer[..., :end, :]
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, live: int, capacity: int) -> None:
        """Reallocate both buffers with ``capacity`` rows, keeping the ``live`` rows."""
        keys = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if live:
            keys[..., :live, :].copy_(self.keys[..., :live, :])
            values[..., :live, :].copy_(self.values[..., :live, :])
        self._key_buffer, self._value_buffer = keys, values

    def move(self, rows: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Copy position ``sources[j]`` to ``targets[j]`` of batch row ``rows[j]``, every head
        (all three shape (m,), int64; targets within the live views). Two indexed copies over
        the flat buffer: fancy indexing of the (B, H, T, d) view took ~7 ms per layer."""
        heads, capacity = self._key_buffer.shape[1], self._key_buffer.shape[2]
        base = (rows[:, None] * heads + torch.arange(heads, device=rows.device)[None, :]) * capacity
        source, target = (base + sources[:, None]).reshape(-1), (base + targets[:, None]).reshape(-1)
        for buffer in (self._key_buffer, self._value_buffer):
            flat = buffer.view(-1, buffer.shape[-1])
            flat.index_copy_(0, target, flat.index_select(0, source))

    def retire_row(self, row: int, live: int) -> None:
        """Remove batch row ``row``: the last row moves into its place (its first ``live``
        positions are copied), and the batch shrinks by one without copying the others."""
        last = self._key_buffer.shape[0] - 1
        if row != last:
            self._key_buffer[row, :, :live].copy_(self._key_buffer[last, :, :live])
            self._value_buffer[row, :, :live].copy_(self._value_buffer[last, :, :live])
        length = self.keys.shape[-2]
        self._key_buffer, self._value_buffer = self._key_buffer[:last], self._value_buffer[:last]
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]

    def reset(self) -> None:
        super().reset()
        self._key_buffer = self._value_buffer = None


def growing_cache() -> DynamicCache:
    """An empty ``DynamicCache`` that creates ``GrowingLayer`` layers on first use."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache


def model_cache(config, own_layers: bool) -> DynamicCache:
    """The cache a tree model runs on: ``growing_cache()``, or, for models whose cache layers keep
    extra per-token state (``own_layers``), transformers' own ``DynamicCache(config=...)`` with
    every plain KV layer swapped for a ``GrowingLayer`` (a sliding-window layer would drop rows
    that a rejected draft's rollback must restore)."""
    if not own_layers:
        return growing_cache()
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) else layer
                    for layer in cache.layers]
    return cache


def cut_back(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` rows of every layer: ``GrowingLayer`` views are shortened in
    place; any other layer class cuts itself back with its own ``crop``."""
    for layer in cache.layers:
        if isinstance(layer, GrowingLayer):
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]
        elif getattr(layer, "keys", None) is not None and layer.keys.shape[-2] > length:
            layer.crop(length - layer.keys.shape[-2])
