"""The target model's tree forward (part of ``target``, the only code touching transformers internals).

``TreeModel`` wraps a causal LM and its KV cache: prefill a prompt, score a
token tree in one forward pass (4D additive mask + per-node position ids),
then keep only the accepted nodes' KV rows. Batch size is 1.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from retrieval_draft.decode.tree import DraftTree
from retrieval_draft.errors import InvalidInputError, UnsupportedModelError
from retrieval_draft.target.kv_cache import growing_cache
from retrieval_draft.target.skinny_linear import SKINNY_ROWS, eligible_linears, skinny_linears
from retrieval_draft.target.transfer import to_device
from retrieval_draft.target.tree_attention import sdpa_configs, tree_attention

_MASKABLE_ATTENTION = ("sdpa", "eager")


def check_tree_support(model: torch.nn.Module) -> None:
    """Raise UnsupportedModelError unless ``model`` can score a tree with a 4D mask."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{type(model).__name__} is an encoder-decoder; only decoder-only LMs are supported")
    params = inspect.signature(model.forward).parameters
    if "position_ids" not in params or "attention_mask" not in params:
        raise UnsupportedModelError(f"{type(model).__name__}.forward takes no position_ids/attention_mask")
    impl = getattr(config, "_attn_implementation", None)
    if impl not in _MASKABLE_ATTENTION:
        raise UnsupportedModelError(
            f"attention implementation {impl!r} cannot take a 4D tree mask; load the model with "
            f"attn_implementation='sdpa' or 'eager'"
        )
    layer_types = set(getattr(config, "layer_types", None) or ())
    if layer_types - {"full_attention", "sliding_attention"}:
        raise UnsupportedModelError(f"layer types {sorted(layer_types)} are not supported (no KV cache compaction)")


def context_limit(model: torch.nn.Module) -> int | None:
    """The model's maximum sequence length in tokens, when its config states one."""
    return getattr(model.config, "max_position_embeddings", None)


class TreeModel:
    """A causal LM plus its KV cache, driven one token tree at a time.

    ``past_len`` counts the tokens whose KV rows are cached.
    """

    def __init__(
        self, model: torch.nn.Module, skinny_sizes: frozenset | None = None, grouped_attention: bool = True
    ) -> None:
        """``skinny_sizes``: tree sizes whose forward uses the skinny matmul on CPU
        (default ``SKINNY_ROWS``; ``VerifyCost.skinny_sizes`` holds the measured choice).
        ``grouped_attention``: tree forwards read grouped-query KV heads in place
        (``tree_attention``); the attribute of that name can be switched later."""
        check_tree_support(model)
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        config = model.config
        self._window = getattr(config, "sliding_window", None)
        self._layer_types = set(getattr(config, "layer_types", None) or ())
        self.cache = growing_cache()
        self.past_len = 0
        self._sdpa_configs = sdpa_configs(model)
        self.grouped_attention = grouped_attention
        self._skinny = eligible_linears(model) if self.device.type == "cpu" else []
        self.skinny_sizes = frozenset(SKINNY_ROWS if skinny_sizes is None else skinny_sizes) if self._skinny else frozenset()

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt (shape (1, L), int64) into a fresh cache; return the last logits, shape (V,)."""
        self.cache = growing_cache()
        length = input_ids.shape[1]
        out = self.model(
            input_ids=input_ids.to(self.device),
            position_ids=torch.arange(length, device=self.device).unsqueeze(0),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.past_len = length
        return out.logits[0, -1].float()

    @torch.no_grad()
    def score_tree(self, tree: DraftTree) -> torch.Tensor:
        """One forward pass over every tree node; return logits of shape (n, V), float32.

        Afterwards the cache holds ``past_len + n`` rows until ``keep`` trims it.
        """
        # A lone root sees the whole cache: the model's own single-token path
        # (no explicit mask) is what plain decoding runs, and it is faster.
        lone = tree.size == 1 and "sliding_attention" not in self._layer_types
        skinny = self._skinny if tree.size in self.skinny_sizes else []
        grouped = self._sdpa_configs if self.grouped_attention and not lone else []
        tokens, positions, mask = self.tree_inputs(tree, masked=not lone)
        with tree_attention(grouped), skinny_linears(skinny):
            out = self.model(
                input_ids=tokens[None],
                position_ids=positions[None],
                attention_mask=mask,
                past_key_values=self.cache,
                use_cache=True,
            )
        return out.logits[0].float()

    def tree_inputs(self, tree: DraftTree, masked: bool = True):
        """The forward's inputs for ``tree`` (n nodes), on the model's device in ONE host copy:
        token ids (n,) int64, position ids (n,) int64 and, when ``masked``, ``_mask``'s
        additive mask(s) in the model's dtype (else None)."""
        positions = tree.depths + self.past_len
        arrays = [tree.tokens, positions] + ([tree.ancestor_mask()] if masked else [])
        moved = to_device(arrays, self.device)
        return moved[0], moved[1], self._mask(moved[1], moved[2], self.past_len) if masked else None

    def keep(self, nodes: np.ndarray) -> None:
        """Keep the KV rows of tree ``nodes`` (shape (m,), increasing, starting with root 0).

        Rows move down to directly follow the old cache; the rest are dropped.
        """
        base = self.past_len
        kept = base + nodes.shape[0]
        contiguous = bool(np.all(nodes == np.arange(nodes.shape[0])))
        index = None if contiguous else to_device([nodes + base], self.device)[0]
        for layer in self.cache.layers:
            if index is not None:
                layer.keys[..., base:kept, :] = layer.keys.index_select(-2, index)
                layer.values[..., base:kept, :] = layer.values.index_select(-2, index)
            layer.keys = layer.keys[..., :kept, :]
            layer.values = layer.values[..., :kept, :]
        self.past_len = kept

    def _mask(self, positions: torch.Tensor, visible: torch.Tensor, past_len: int):
        """Additive float mask(s) for new tokens at ``positions`` (shape (n,), on the device).

        ``visible``: (n, n) bool, which new tokens each new token may see. The
        cache's ``past_len`` rows sit at positions 0..past_len-1 and are all
        visible, except beyond a sliding window on sliding-attention layers.
        Returns a (1, 1, n, past_len + n) tensor in the model's dtype (0 = attend,
        the dtype's lowest value = blocked), or a dict of them keyed by layer
        type for models that mix full and sliding attention. Built on the device.
        """
        n = positions.shape[0]
        lowest = torch.finfo(self.dtype).min
        full = torch.zeros((1, 1, n, past_len + n), dtype=self.dtype, device=positions.device)
        full[0, 0, :, past_len:].masked_fill_(~visible, lowest)
        if "sliding_attention" not in self._layer_types or not self._window:
            return full
        key_pos = torch.cat([torch.arange(past_len, device=positions.device), positions])
        outside = (positions[:, None] - key_pos[None, :]) >= self._window
        return {"full_attention": full, "sliding_attention": full.masked_fill(outside, lowest)}


def validate_prompt(input_ids: torch.Tensor, max_new_tokens: int, vocab_size: int, limit: int | None) -> None:
    """Raise InvalidInputError for inputs the engine cannot serve."""
    if input_ids.dim() != 2:
        raise InvalidInputError(f"input_ids must have shape (1, L), got {tuple(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise InvalidInputError(f"batch size {input_ids.shape[0]} is not supported; pass one sequence")
    if input_ids.shape[1] == 0:
        raise InvalidInputError("the prompt is empty")
    if max_new_tokens < 1:
        raise InvalidInputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise InvalidInputError(f"token ids must lie in [0, {vocab_size}); got range [{low}, {high}]")
    if limit is not None and input_ids.shape[1] >= limit:
        raise InvalidInputError(
            f"the prompt has {input_ids.shape[1]} tokens; the model's context holds {limit}"
        )
