"""How a model masks attention, read from its config the way transformers reads it.

transformers 5 builds a decoder's masks by one rule (``masking_utils.create_masks_for_generate``
states it for every model): a config with ``layer_types`` gets one mask per layer kind, keyed
by kind; otherwise a config with ``sliding_window`` slides every layer (Mistral, Mixtral,
Starcoder2, Phi-3, Qwen3-MoE), and one with ``attention_chunk_size`` chunks every layer;
otherwise attention is plainly causal. A 4D mask passed in is used as it is, so a tree mask
must carry each kind's rule itself.

``attention_layout(model)`` returns that rule as an ``AttentionLayout``: the mask kinds, whether
the model reads masks keyed by kind, and how trees are verified:

- ``"tree"``: a whole token tree in one forward (4D additive mask, per-node position ids);
- ``"chain"``: the tree's best path with the model's own causal masking and no explicit
  mask, as HF's assisted decoding verifies (position biases such as ALiBi, attention kinds a
  4D mask cannot express, attention implementations that take no 4D mask);

and it raises ``UnsupportedModelError`` for models whose cache holds recurrent state that
cannot be cut back to the accepted tokens (state-space, linear-attention and convolution layers,
judged by the cache layer kinds transformers' own ``DynamicCache`` would create).
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from retrieval_draft.errors import UnsupportedModelError

if TYPE_CHECKING:
    from retrieval_draft.tree import DraftTree

FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"
TREE, CHAIN = "tree", "chain"
_MASKABLE_ATTENTION = frozenset({"sdpa", "eager"})
# Cache layer kinds (transformers' ``DYNAMIC_LAYER_TYPE_MAPPING``): one KV row per token (our
# in-place rows), rows plus extra per-token state that the layer's own ``crop`` cuts back, and
# running states that nothing can cut back.
_ROW_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "dummy"})
_OWN_CACHE_KINDS = frozenset({"indexed_attention"})
_RECURRENT_KINDS = frozenset({"linear_attention", "conv", "hybrid", "hybrid_sliding", "mamba", "attention_mamba"})


@dataclass(frozen=True)
class MaskKind:
    """One attention rule: ``key`` names it in a keyed mask dict; ``span`` is the window or
    chunk length in tokens (None for full causal attention)."""

    key: str
    span: int | None = None

    def allows(self, query_pos, key_pos):
        """Which keys a query may see beyond causality, by position id, for a kind with a span: bool,
        ``query_pos[..., :, None]`` broadcast against ``key_pos[..., None, :]`` (numpy or torch alike)."""
        q, k = query_pos[..., :, None], key_pos[..., None, :]
        if self.key == CHUNKED:
            return (q // self.span) == (k // self.span)
        return (q - k) < self.span  # a sliding window: the last ``span`` positions, the query's own included


# The keyword a model's forward takes its KV cache by, newest first: transformers 5.24 renamed
# ``past_key_values`` to ``cache`` (the old name is deprecated there and goes in 5.40).
CACHE_KEYWORDS = ("cache", "past_key_values")


@dataclass(frozen=True)
class AttentionLayout:
    """A model's attention rule for tree verification.

    Attributes:
        kinds: the distinct mask kinds its layers use (one for most models).
        keyed: the model reads a dict of 4D masks keyed by ``MaskKind.key``.
        mode: ``TREE`` or ``CHAIN``.
        chain_reason: why trees are verified as chains (None in tree mode).
        takes_positions: ``forward`` accepts ``position_ids``.
        own_cache_kinds: cache layer kinds that keep transformers' own layer class (extra
            per-token state, cut back by the layer's ``crop``); empty for most models.
        cache_name: the keyword ``forward`` takes its KV cache by: ``cache`` from
            transformers 5.24, ``past_key_values`` before (deprecated there, removed in 5.40).
    """

    kinds: tuple[MaskKind, ...]
    keyed: bool
    mode: str
    chain_reason: str | None
    takes_positions: bool
    own_cache_kinds: tuple[str, ...] = ()
    cache_name: str = "past_key_values"

    def verifiable(self, tree: "DraftTree") -> "DraftTree":
        """``tree`` as this model can score it: itself, or its best chain in chain mode."""
        return tree.best_chain() if self.mode == CHAIN else tree

    def position_kwargs(self, positions: torch.Tensor) -> dict:
        """``position_ids=positions`` for models whose forward takes them (else nothing)."""
        return {"position_ids": positions} if self.takes_positions else {}

    def cache_kwargs(self, cache) -> dict:
        """``cache`` under the keyword this model's ``forward`` takes it by."""
        return {self.cache_name: cache}

    @property
    def windowed(self) -> bool:
        """Some layer sees less than the whole causal past (a sliding window or a chunk)."""
        return any(kind.span is not None for kind in self.kinds)

    def tree_over_dense_cache(self, among: torch.Tensor, cached: int, positions: torch.Tensor, dtype: torch.dtype):
        """``masks`` for trees after ``cached`` cache slots that every row sees, slot j holding
        position j: new slot i sees new slot j where ``among`` (B, n, n) bool holds; ``positions``
        (B, n) are the new slots' position ids. Without windowed layers the (B, 1, n, cached + n)
        additive mask is built straight from ``among`` (two operations where the general rule takes
        nine); windowed kinds go through ``masks``. Same return as ``masks``."""
        rows, width, _ = among.shape
        if not self.windowed:
            mask = torch.zeros((rows, 1, width, cached + width), dtype=dtype, device=among.device)
            mask[:, 0, :, cached:].masked_fill_(~among, torch.finfo(dtype).min)
            return {kind.key: mask for kind in self.kinds} if self.keyed else mask
        allowed = torch.ones((rows, width, cached + width), dtype=torch.bool, device=among.device)
        allowed[:, :, cached:] = among
        key_pos = torch.cat([torch.arange(cached, device=among.device).expand(rows, -1), positions], dim=1)
        return self.masks(allowed, positions, key_pos, dtype)

    def masks(self, allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor, dtype: torch.dtype):
        """Additive masks for ``allowed`` (B, n, K) bool (causal and tree visibility), narrowed by each
        kind's rule over position ids ``query_pos`` (B, n) and ``key_pos`` (B, K).

        Returns one (B, 1, n, K) tensor in ``dtype`` (0 = attend, the dtype's lowest value =
        blocked), or a dict of them keyed by kind when the model reads keyed masks.
        """
        built = {}
        for kind in self.kinds:
            seen = allowed if kind.span is None else allowed & kind.allows(query_pos, key_pos)
            mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device)
            built[kind.key] = mask.masked_fill_(~seen, torch.finfo(dtype).min)[:, None]
        return built if self.keyed else built[self.kinds[0].key]


def attention_layout(model: torch.nn.Module) -> AttentionLayout:
    """The attention rule of ``model`` (a decoder-only causal LM); raises ``UnsupportedModelError``
    for encoder-decoders and for caches that cannot be cut back to the accepted tokens."""
    config = model.config
    name = type(model).__name__
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{name} is an encoder-decoder; only decoder-only LMs are supported")
    params = inspect.signature(model.forward).parameters
    cache_name = next((key for key in CACHE_KEYWORDS if key in params), None)
    if cache_name is None:
        raise UnsupportedModelError(
            f"{name} takes no KV cache (cache / past_key_values): its recurrent state or full recomputation cannot "
            "be cut back to accepted tokens"
        )
    own_class = _own_cache_class(params[cache_name])
    if own_class is not None:
        raise UnsupportedModelError(
            f"{name} keeps its own cache ({own_class}), not a per-token KV cache: its recurrent state cannot be cut "
            "back to accepted tokens"
        )
    cache_kinds = cache_layer_kinds(config)
    recurrent = sorted(kind for kind in cache_kinds if kind in _RECURRENT_KINDS)
    if recurrent:
        raise UnsupportedModelError(
            f"{name} has recurrent layers ({', '.join(recurrent)}) whose state cannot be cut back to accepted tokens"
        )
    odd = sorted(cache_kinds - _ROW_KINDS - _OWN_CACHE_KINDS)
    if odd:
        raise UnsupportedModelError(f"{name} has cache layers ({', '.join(odd)}) that cannot be cut back to accepted tokens")
    layer_types = tuple(getattr(config, "layer_types", None) or ())
    kinds, keyed, unknown = _mask_kinds(config, layer_types)
    own = sorted(cache_kinds & _OWN_CACHE_KINDS)
    reason = _chain_reason(config, params, unknown) or (f"its cache layers ({', '.join(own)}) keep extra state" if own else None)
    return AttentionLayout(kinds, keyed, CHAIN if reason else TREE, reason, "position_ids" in params, tuple(own),
                           cache_name)


def _own_cache_class(param: inspect.Parameter) -> str | None:
    """The name of the cache class ``forward`` declares for its cache argument when that class is
    not a transformers ``Cache`` (xLSTM's ``xLSTMCache`` holds recurrent state); None when it is
    one, or when the annotation names no ``...Cache`` class (tensors, tuples, a string)."""
    from transformers.cache_utils import Cache

    annotation = param.annotation
    members = typing.get_args(annotation) or (annotation,)
    own = [m for m in members if isinstance(m, type) and m.__name__.endswith("Cache") and not issubclass(m, Cache)]
    return own[0].__name__ if own else None


def cache_layer_kinds(config) -> frozenset[str]:
    """The cache layer kinds transformers' ``DynamicCache(config=...)`` would create for ``config``."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    decoder = config.get_text_config(decoder=True)
    try:
        kinds, _ = get_layer_types_and_kwargs(decoder)
    except (AttributeError, TypeError, ValueError):  # configs from before per-layer configs
        kinds = getattr(decoder, "layer_types", None) or ()
    return frozenset(kinds)


def _mask_kinds(config, layer_types: tuple) -> tuple[tuple[MaskKind, ...], bool, list[str]]:
    """(kinds, keyed, layer kinds no 4D tree mask can express), by transformers' own rule."""
    window = getattr(config, "sliding_window", None)
    chunk = getattr(config, "attention_chunk_size", None)
    if layer_types:
        spans = {FULL: None, SLIDING: window, CHUNKED: chunk}
        known = [t for t in dict.fromkeys(layer_types) if t in spans and (t == FULL or spans[t])]
        unknown = sorted(set(layer_types) - set(known) - {"moe", "mlp"})
        return tuple(MaskKind(t, spans[t]) for t in known) or (MaskKind(FULL),), True, unknown
    if window:
        return (MaskKind(SLIDING, int(window)),), False, []
    if chunk:
        return (MaskKind(CHUNKED, int(chunk)),), False, []
    return (MaskKind(FULL),), False, []


def _chain_reason(config, params, unknown: list[str]) -> str | None:
    """Why this model cannot take a 4D tree mask with per-node positions (None when it can)."""
    if "position_ids" not in params or "attention_mask" not in params:
        return "its forward takes no position_ids (position biases such as ALiBi)"
    if any(getattr(config, flag, False) for flag in ("alibi", "use_alibi")):
        return "ALiBi position biases"
    if unknown:
        return f"layer kinds {unknown} have no tree mask"
    if "local" in (getattr(config, "attention_layers", None) or ()):
        return "its local layers mask their window by row index inside the layer (GPT-Neo)"
    impl = getattr(config, "_attn_implementation", None)
    if impl not in _MASKABLE_ATTENTION:
        return f"attention implementation {impl!r} takes no 4D mask (load with attn_implementation='sdpa' for trees)"
    return None
