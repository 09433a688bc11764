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

After the prefill the layers' buffers are pooled once (``pooled``; ``TreeModel.pools`` keeps
the result): a ``KVPool`` holds every layer's keys in one tensor and values in another, so that
``TreeModel.keep`` moves the accepted rows of all layers in one indexed copy, shortens every
layer by setting its length (its ``keys``/``values`` views are made when read: making 60 views per
step cost 0.25 ms of host time at 40-node trees on the 2-core CPU), and retires a finished batch
row with one copy per tensor. Layer by layer a move took two operations for the keys and
two for the values of each layer: 120 for SmolLM2's 30 layers, 1.6 ms per move on the 2-core CPU
where the pooled one takes 0.08 ms (a microbenchmark), and on a GPU as many kernel launches.
Pooling copies the prefill's rows once, so for that moment the cache takes twice its memory.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from retrieval_draft.model.transfer import to_device

MIN_CAPACITY = 256  # rows allocated at least, so short prompts do not regrow every few steps

# Where a pool's two tensors come from: (name "keys" or "values", shape, dtype, device) -> an
# uninitialised tensor. ``fresh`` allocates; static steps hand back the last call's tensors of the
# same shape (``static_shapes.PoolSlab``), so compiled graphs keep their addresses.
Allocate = Callable[[str, tuple, torch.dtype, torch.device], torch.Tensor]


def fresh(name: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A new uninitialised tensor (``Allocate``)."""
    return torch.empty(shape, dtype=dtype, device=device)


class GrowingLayer(DynamicLayer):
    """One layer's KV rows in a preallocated buffer; ``keys``/``values`` are prefix views of it.

    The number of live rows is ``_length`` (``keys.shape[-2]``), and ``keys``/``values`` are made
    from it when read, so shortening the cache (``TreeModel.keep`` after verification, through
    ``KVPool.cut``) sets one integer per layer instead of making two views. Assigning a prefix view
    of the buffer (transformers' ``crop``) sets the length; before the first update, ``keys`` and
    ``values`` are whatever transformers assigned.

    ``reserve``: positions to allocate beyond the first update's rows (the prefill), so that
    decoding writes in place; None allocates twice the rows (the prefill then copies its rows
    once more when the buffers grow, and a pool of them holds twice the memory).
    """

    def __init__(self, reserve: int | None = None) -> None:
        super().__init__()
        self.reserve = reserve

    _key_buffer: torch.Tensor | None = None
    _value_buffer: torch.Tensor | None = None
    _length = 0
    _pool: "KVPool | None" = None

    @property
    def keys(self) -> torch.Tensor | None:
        """(B, H_kv, length, d_k): the live rows, a view of the buffer."""
        if self._key_buffer is None:
            return self.__dict__.get("_loose_keys")
        return self._key_buffer[..., : self._length, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._set_view(value, self._key_buffer, "_loose_keys")

    @property
    def values(self) -> torch.Tensor | None:
        """(B, H_kv, length, d_v): the live rows, a view of the buffer."""
        if self._value_buffer is None:
            return self.__dict__.get("_loose_values")
        return self._value_buffer[..., : self._length, :]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._set_view(value, self._value_buffer, "_loose_values")

    def _set_view(self, value: torch.Tensor | None, buffer: torch.Tensor | None, loose: str) -> None:
        if buffer is None:
            self.__dict__[loose] = value
        elif value is not None and value.data_ptr() == buffer.data_ptr() and value.shape[-2] <= buffer.shape[-2]:
            self._length = value.shape[-2]
        else:
            raise RuntimeError("a GrowingLayer's keys and values are prefixes of its buffer; only such a view can be assigned")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = self._value_buffer = None
        self._length = 0
        self._pool = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write (B, H_kv, n, d) new rows after the live ones; return the (B, H_kv, length, d) views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self._length
        end = start + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            first = self._key_buffer is None and self.reserve is not None
            capacity = max(end + self.reserve if first else 2 * end, MIN_CAPACITY)
            if self._pool is not None:
                self._pool.grow(capacity)
            else:
                self._grow(key_states, value_states, start, capacity)
        self._key_buffer[..., start:end, :].copy_(key_states)
        self._value_buffer[..., start:end, :].copy_(value_states)
        self._length = end
        return self._key_buffer[..., :end, :], self._value_buffer[..., :end, :]

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, live: int, capacity: int) -> None:
        """Reallocate both buffers with ``capacity`` rows, keeping the ``live`` rows."""
        keys = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if live:
            keys[..., :live, :].copy_(self.keys[..., :live, :])
            values[..., :live, :].copy_(self.values[..., :live, :])
        self._key_buffer, self._value_buffer = keys, values

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        self._length = 0
        self._pool = None
        super().reset()


class KVPool:
    """The buffers of ``GrowingLayer``s of one shape, dtype and device in two tensors.

    ``keys`` has shape (layers, B0, H_kv, capacity, d_k) and ``values`` (layers, B0, H_kv,
    capacity, d_v) (some models' values are narrower than their keys), for the B0 rows the batch
    had when the pool was made. The live batch is their first ``rows`` rows (a retired row's
    place is taken by the last row, so a row keeps its index), and layer i's ``_key_buffer`` /
    ``_value_buffer`` are views of entry i.
    """

    def __init__(self, layers: list[GrowingLayer], allocate: Allocate = fresh) -> None:
        first = layers[0]
        keys, values = first._key_buffer, first._value_buffer
        self.layers = layers
        self.rows = keys.shape[0]
        self.keys = allocate("keys", (len(layers), *keys.shape), keys.dtype, keys.device)
        self.values = allocate("values", (len(layers), *values.shape), values.dtype, values.device)
        for i, layer in enumerate(layers):
            length = layer.keys.shape[-2]
            self.keys[i, ..., :length, :].copy_(layer.keys)
            self.values[i, ..., :length, :].copy_(layer.values)
            layer._pool = self
        self._point()

    @classmethod
    def seeded(cls, layers: list[GrowingLayer], keys: torch.Tensor, values: torch.Tensor, length: int) -> "KVPool":
        """A pool over ``keys`` (layers, B, H_kv, capacity, d_k) and ``values`` (layers, B, H_kv,
        capacity, d_v) whose first ``length`` positions already hold rows (``seeded_cache``):
        ``layers`` (initialised ``GrowingLayer``s, one per entry) read and write them in place."""
        pool = cls.__new__(cls)
        pool.layers, pool.rows, pool.keys, pool.values = layers, keys.shape[1], keys, values
        for layer in layers:
            layer._pool, layer._length = pool, length
        pool._point()
        return pool

    @property
    def capacity(self) -> int:
        """Positions each row can hold before the pool grows."""
        return self.keys.shape[3]

    def _point(self) -> None:
        """Every layer's buffers as views of the pool (its keys and values keep their length)."""
        keys, values = self.keys[:, : self.rows].unbind(0), self.values[:, : self.rows].unbind(0)
        for layer, key_buffer, value_buffer in zip(self.layers, keys, values):
            layer._key_buffer, layer._value_buffer = key_buffer, value_buffer

    def grow(self, capacity: int) -> None:
        """Reallocate both tensors with ``capacity`` positions per row, every layer's rows kept (one copy each)."""
        held = min(self.capacity, capacity)
        grown = []
        for old in (self.keys, self.values):
            new = old.new_empty((old.shape[0], self.rows, old.shape[2], capacity, old.shape[4]))
            new[..., :held, :].copy_(old[:, : self.rows, :, :held])
            grown.append(new)
        self.keys, self.values = grown
        self._point()

    def move(self, rows: np.ndarray, sources: np.ndarray, targets: np.ndarray) -> None:
        """Copy position ``sources[j]`` to ``targets[j]`` of batch row ``rows[j]``, every layer and
        head (all three shape (m,), int64, on the host; targets within the live views): the flat
        indices worked out on the host and sent in one copy, then per tensor one indexed read and
        one indexed write over its flat view."""
        indices = {}
        for tensor in (self.keys, self.values):
            heads = tensor.shape[2]
            if heads not in indices:  # keys and values have the same heads in every model seen so far
                offsets = (rows[:, None] * heads + np.arange(heads)[None, :]) * self.capacity  # (m, H)
                indices[heads] = to_device([(offsets + sources[:, None]).reshape(-1),
                                            (offsets + targets[:, None]).reshape(-1)], tensor.device)
            source, target = indices[heads]
            flat = tensor.view(tensor.shape[0], -1, tensor.shape[-1])
            flat.index_copy_(1, target, flat.index_select(1, source))

    def cut(self, length: int) -> None:
        """Every layer keeps the first ``length`` positions of its rows (nothing copied)."""
        for layer in self.layers:
            layer._length = length

    def retire_row(self, row: int, live: int) -> None:
        """Remove batch row ``row``: the last row moves into its place (its first ``live``
        positions, every layer in one copy per tensor), and the batch shrinks by one without
        copying the others."""
        last = self.rows - 1
        if row != last:
            self.keys[:, row, :, :live].copy_(self.keys[:, last, :, :live])
            self.values[:, row, :, :live].copy_(self.values[:, last, :, :live])
        self.rows = last
        self._point()


def pooled(cache: DynamicCache, allocate: Allocate = fresh) -> list[KVPool]:
    """The pools holding ``cache``'s ``GrowingLayer``s; layers with buffers but no pool yet are
    pooled first, one pool per shape, dtype and device of their key and value buffers (its
    tensors from ``allocate``)."""
    pools: dict[int, KVPool] = {}
    loose: dict[tuple, list[GrowingLayer]] = {}
    for layer in cache.layers:
        if not isinstance(layer, GrowingLayer) or getattr(layer, "_key_buffer", None) is None:
            continue
        if layer._pool is not None:
            pools[id(layer._pool)] = layer._pool
        else:
            keys, values = layer._key_buffer, layer._value_buffer
            kind = (tuple(keys.shape), tuple(values.shape), keys.dtype, values.dtype, keys.device)
            loose.setdefault(kind, []).append(layer)
    return list(pools.values()) + [KVPool(layers, allocate) for layers in loose.values()]


def growing_cache(reserve: int | None = None) -> DynamicCache:
    """An empty ``DynamicCache`` that creates ``GrowingLayer(reserve)`` layers on first use."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = partial(GrowingLayer, reserve)
    return cache


def seeded_cache(seeds: list, first: int, capacity: int, rows: int,
                 allocate: Allocate = fresh) -> tuple[DynamicCache, KVPool]:
    """A cache of ``GrowingLayer``s in one pool of ``capacity`` positions per row (at least
    ``MIN_CAPACITY``; its tensors from ``allocate``), and that pool. ``seeds``: per row, None or known
    rows (``prefix_cache.RowSeed``: ``keys`` (layers, H_kv, >= count, d_k), ``values``, ``count``), copied
    to slots first - count .. first - 1; slots before them hold zeros (hidden, but finite)."""
    sample = next(seed for seed in seeds if seed is not None)
    layers, heads, _, key_dim = sample.keys.shape
    capacity = max(capacity, MIN_CAPACITY)
    keys = allocate("keys", (layers, rows, heads, capacity, key_dim), sample.keys.dtype, sample.keys.device)
    values = allocate("values", (layers, rows, heads, capacity, sample.values.shape[-1]), sample.values.dtype,
                      sample.values.device)
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


def model_cache(config, own_layers: bool, reserve: int | None = None) -> DynamicCache:
    """The cache a tree model runs on: ``growing_cache()``, or, for models whose cache layers keep
    extra per-token state (``own_layers``), transformers' own ``DynamicCache(config=...)`` with
    every plain KV layer swapped for a ``GrowingLayer`` (a sliding-window layer would drop rows
    that a rejected draft's rollback must restore). ``reserve``: ``GrowingLayer``'s."""
    if not own_layers:
        return growing_cache(reserve)
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer(reserve) if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) else layer
                    for layer in cache.layers]
    return cache


def cut_back(cache: DynamicCache, length: int, pools: list[KVPool]) -> None:
    """Keep the first ``length`` rows of every layer: the ``GrowingLayer``s' views are shortened
    in place, a pool at a time (``pools``: every one of ``cache``'s, from ``pooled``); any other
    layer class cuts itself back with its own ``crop``."""
    for pool in pools:
        pool.cut(length)
    for layer in cache.layers:
        if not isinstance(layer, GrowingLayer) and getattr(layer, "keys", None) is not None and layer.keys.shape[-2] > length:
            layer.crop(length - layer.keys.shape[-2])
