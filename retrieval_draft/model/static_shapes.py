"""Static-shape verification: a few fixed tree widths over the call's preallocated KV pool.

HF's fast decoding path (``generate(..., cache_implementation="static")``) runs every step's
forward at one shape over a cache allocated once, so that ``torch.compile`` can specialise it
and, on a GPU, CUDA graphs can replay it without launching kernels one by one from Python. Our
steps change shape every step (the tree's width W, the live cache length T), so on that path:

- a step's trees are padded to the next of a few widths (``WIDTHS``; dead slots see only the
  cache and themselves and are never kept, as any padding in ``TreeModel.pack``);
- every layer reads its whole (B, H_kv, C, d) slice of the call's ``KVPool`` (C positions per
  row, allocated with the prompt for the prompt, every new token and the widest tree), and the
  mask blocks the slots past the live ones: the attention's shapes depend on B and W only;
- the new rows are written at slots start .. start + W - 1 with ``index_copy_`` at ``start``, a
  one-element tensor on the device, not a Python int, so that one graph serves every step;
- the accepted rows are compacted inside the pool by ``KVPool.move``, outside the graph, as on
  the eager path.

``StaticSteps`` holds one call's choice (widths, the forward: the model itself or a compiled call
of it, and the model's ``PoolSlab``, both kept per model by ``PluginMemory``). The slab hands a
call the last call's pool tensors when their shape is the same (capacities are multiples of
``CAPACITY_STEP``), so a compiled forward's CUDA graphs find the cache where they recorded it
instead of recording again. Whether to compile follows HF's own
rule for ``cache_implementation="static"`` (``compiles``): on CUDA (and the other accelerators
HF lists) unless ``generation_config.disable_compile``, elsewhere only when its
``compile_config`` asks for every device.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from retrieval_draft.errors import InvalidInputError
from retrieval_draft.model.transfer import to_device

WIDTHS = (1, 4, 8, 16, 32, 64)  # tree widths a static step runs at: a tree is padded up to the next
COMPILING_DEVICES = frozenset({"cuda", "xpu", "neuron", "tpu"})  # where HF's static cache compiles by default
CAPACITY_STEP = 256  # a static pool's positions per row are a multiple of this, so prompts of near lengths share graphs
RECOMPILE_LIMIT = 64  # dynamo graphs per code object while a static step runs: one per width and batch size


def static_capacity(needed: int) -> int:
    """Positions per row of a static pool that must hold ``needed``: the next multiple of
    ``CAPACITY_STEP``, so that calls whose prompts differ by a few tokens run at one shape."""
    return -(-needed // CAPACITY_STEP) * CAPACITY_STEP


def static_widths(nodes: int, widths: tuple[int, ...] = WIDTHS) -> tuple[int, ...]:
    """The widths for trees of at most ``nodes`` nodes: those of ``widths`` below it, then ``nodes``
    itself (the default budget of 32 draft nodes gives 1, 4, 8, 16, 32, 33: a full tree is not
    padded to 64)."""
    return tuple(w for w in widths if w < nodes) + (nodes,)


def padded_width(width: int, widths: tuple[int, ...] = WIDTHS) -> int:
    """The smallest of ``widths`` (increasing) that holds ``width`` nodes."""
    at = bisect.bisect_left(widths, width)
    if at == len(widths):
        raise InvalidInputError(f"a tree of {width} nodes is wider than the widest static width ({widths[-1]})")
    return widths[at]


def compiles(device: torch.device, generation_config) -> bool:
    """HF's rule for compiling the forward of a static-cache ``generate`` on ``device``
    (``GenerationMixin._valid_auto_compile_criteria``): never with ``disable_compile``; on the
    accelerators in ``COMPILING_DEVICES``; elsewhere only when ``compile_config`` asks for all devices."""
    if getattr(generation_config, "disable_compile", False):
        return False
    config = getattr(generation_config, "compile_config", None)
    return device.type in COMPILING_DEVICES or bool(config is not None and config._compile_all_devices)


def compiled_forward(model: torch.nn.Module, compile_config) -> Callable:
    """``model``'s forward compiled for static steps: ``compile_config``'s backend, mode, options
    and fullgraph (HF's ``CompileConfig``, None for its defaults: inductor, "reduce-overhead", which
    on CUDA replays CUDA graphs), with shapes always specialised (``dynamic=False``): each width
    and batch size gets a graph of its own rather than one graph over symbolic shapes."""
    from transformers import CompileConfig

    config = compile_config if compile_config is not None else CompileConfig()
    return torch.compile(model, backend=config.backend, mode=config.mode, options=config.options,
                         fullgraph=config.fullgraph, dynamic=False)


class SlotLayer(DynamicLayer):
    """One layer of a ``KVPool`` read whole.

    ``keys`` (B, H_kv, C, d_k) and ``values`` (B, H_kv, C, d_v) are the layer's views of the
    pool (C = the pool's capacity); ``start`` is a one-element int64 tensor on their device, the
    first slot the next forward writes. ``update`` copies the forward's (B, H_kv, n, d) new rows
    to slots start .. start + n - 1 and returns the whole views, so every forward of one width
    sees tensors of one shape (the mask hides the slots that hold nothing live).
    """

    is_compileable = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, start: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.start = keys, values, start
        self.device = keys.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write (B, H_kv, n, d) new rows at slots start .. start + n - 1; return the (B, H_kv, C, d) views."""
        slots = torch.arange(key_states.shape[-2], device=self.device) + self.start
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        """C: every slot is read (positions and the mask come from the caller)."""
        return self.keys.shape[-2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(key length C, offset 0): the whole pool."""
        return self.keys.shape[-2], 0


def slot_cache(pool, start: torch.Tensor) -> DynamicCache:
    """A cache whose layers are ``SlotLayer``s over every layer of ``pool`` (a ``KVPool``), writing at ``start``.

    Made again whenever the pool's views change (after ``KVPool.retire_row`` or ``grow``). On CUDA
    the views are marked as static addresses, so a compiled forward's CUDA graphs write the
    pool in place instead of copying it in as an input."""
    cache = DynamicCache()
    cache.layers = [SlotLayer(layer._key_buffer, layer._value_buffer, start) for layer in pool.layers]
    if start.device.type == "cuda":
        for layer in cache.layers:
            torch._dynamo.mark_static_address(layer.keys)
            torch._dynamo.mark_static_address(layer.values)
    return cache


def static_inputs(slots, capacity: int, tokens: np.ndarray, positions: np.ndarray, among: np.ndarray, layout,
                  dtype: torch.dtype, device: torch.device):
    """A static step's inputs on ``device`` in one host copy: tokens and positions (B, W) int64 and
    the additive mask over the whole pool, (B, 1, W, C) in ``dtype`` (a dict by kind for keyed
    models, ``AttentionLayout.masks``): the live slots as ``slots`` (``RowSlots``, T = its length)
    says, the tree at slots T .. T + W - 1 as ``among`` (B, W, W) bool says, nothing past them."""
    rows, width = positions.shape
    length = slots.length
    allowed = np.zeros((rows, width, capacity), dtype=bool)
    key_pos = np.zeros((rows, capacity), dtype=np.int64)
    if slots.dense:  # slot j holds position j in every row, all visible (``RowSlots``)
        allowed[:, :, :length] = True
        key_pos[:, :length] = np.arange(length)
    else:
        allowed[:, :, :length] = slots.visible[:, None, :]
        key_pos[:, :length] = slots.slot_pos
    allowed[:, :, length : length + width] = among
    key_pos[:, length : length + width] = positions
    tokens_t, positions_t, allowed_t, key_pos_t = to_device([tokens, positions, allowed, key_pos], device)
    return tokens_t, positions_t, layout.masks(allowed_t, positions_t, key_pos_t, dtype)


class PoolSlab:
    """The tensors of one model's last static pool, handed to its next call when the shape matches
    (``kv_cache.Allocate``). Holds one pool at a time: a call of another shape replaces it. Calls
    with one model run one at a time (``ModelMemory.lock``), so one call's pool is never another's."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[tuple, torch.Tensor]] = {}

    def take(self, name: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The held ``name`` tensor ("keys" or "values") if it has this shape, dtype and device, else a new one
        (then held). Its contents are whatever the last call left."""
        key = (tuple(shape), dtype, torch.device(device))
        held = self._held.get(name)
        if held is None or held[0] != key:
            held = self._held[name] = (key, torch.empty(shape, dtype=dtype, device=device))
        return held[1]


@dataclass(frozen=True)
class StaticSteps:
    """One call's static-shape verification (``TreeModel.static``).

    Attributes:
        widths: the tree widths forwards run at, increasing (``WIDTHS``).
        forward: what runs the model: the model itself (eager) or ``compiled_forward``'s result.
        compiled: whether ``forward`` is compiled (the skinny matmul and the grouped tree
            attention, which swap modules and functions at run time, stay off then).
        slab: where the call's pool comes from (the model's ``PoolSlab``), None for fresh tensors.
    """

    widths: tuple[int, ...] = WIDTHS
    forward: Callable | None = None
    compiled: bool = False
    slab: PoolSlab | None = None

    def __post_init__(self) -> None:
        if not self.widths or list(self.widths) != sorted(set(self.widths)) or self.widths[0] < 1:
            raise InvalidInputError(f"static widths must be increasing positive sizes; got {self.widths}")

    @property
    def widest(self) -> int:
        return self.widths[-1]

    def width(self, nodes: int) -> int:
        """The width a step whose widest tree has ``nodes`` nodes runs at."""
        return padded_width(nodes, self.widths)
