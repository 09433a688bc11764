"""The target model's tree forward (part of ``target``, the only code touching transformers internals).

``TreeModel`` wraps a causal LM and its KV cache: prefill a prompt, score a
token tree in one forward pass (4D additive mask + per-node position ids),
then keep only the accepted nodes' KV rows. Batch size is 1. Models that
cannot take a tree mask (``attention_layout``) score one chain, the tree's
best path, with their own causal masking.
"""

from __future__ import annotations

import numpy as np
import torch

from retrieval_draft.tree import DraftTree
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.target.attention_layout import CHAIN, attention_layout
from retrieval_draft.target.chain_probe import probe_chain_forward
from retrieval_draft.target.kv_cache import cut_back, model_cache
from retrieval_draft.target.skinny_linear import SKINNY_ROWS, eligible_linears, skinny_linears
from retrieval_draft.target.transfer import to_device
from retrieval_draft.target.tree_attention import sdpa_configs, tree_attention

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
        self.layout = attention_layout(model)
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        if self.layout.mode == CHAIN:
            probe_chain_forward(model, self._fresh_cache, self.layout.takes_positions)
        self.cache = self._fresh_cache()
        self.past_len = 0
        self._sdpa_configs = sdpa_configs(model)
        self.grouped_attention = grouped_attention
        self._skinny = eligible_linears(model) if self.device.type == "cpu" else []
        self.skinny_sizes = frozenset(SKINNY_ROWS if skinny_sizes is None else skinny_sizes) if self._skinny else frozenset()

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt (shape (1, L), int64) into a fresh cache; return the last logits, shape (V,)."""
        self.cache = self._fresh_cache()
        length = input_ids.shape[1]
        out = self.model(
            input_ids=input_ids.to(self.device),
            **self.layout.position_kwargs(torch.arange(length, device=self.device).unsqueeze(0)),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.past_len = length
        return out.logits[0, -1].float()

    def verifiable(self, tree: DraftTree) -> DraftTree:
        """``tree`` as this model can score it (``AttentionLayout.verifiable``)."""
        return self.layout.verifiable(tree)

    @torch.no_grad()
    def score_tree(self, tree: DraftTree) -> torch.Tensor:
        """One forward pass over every tree node; return logits of shape (n, V), float32.

        In chain mode ``tree`` must be a chain (``verifiable``). Afterwards the cache
        holds ``past_len + n`` rows until ``keep`` trims it.
        """
        chain = self.layout.mode == CHAIN
        if chain and tree.size != int(tree.depths[-1]) + 1:
            raise InvalidInputError("this model verifies chains only: pass TreeModel.verifiable(tree)")
        # A lone root (or a chain) sees the whole cache through the model's own causal
        # mask: what plain decoding runs, and faster. Windowed layers need our mask.
        own_mask = chain or (tree.size == 1 and not self.layout.windowed)
        skinny = self._skinny if tree.size in self.skinny_sizes else []
        grouped = self._sdpa_configs if self.grouped_attention and not own_mask else []
        tokens, positions, mask = self.tree_inputs(tree, masked=not own_mask)
        with tree_attention(grouped), skinny_linears(skinny):
            out = self.model(
                input_ids=tokens[None],
                **self.layout.position_kwargs(positions[None]),
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
        if not contiguous:  # tree mode: every layer is a GrowingLayer
            index = to_device([nodes + base], self.device)[0]
            for layer in self.cache.layers:
                layer.keys[..., base:kept, :] = layer.keys.index_select(-2, index)
                layer.values[..., base:kept, :] = layer.values.index_select(-2, index)
        cut_back(self.cache, kept)
        self.past_len = kept

    def _fresh_cache(self):
        return model_cache(self.model.config, bool(self.layout.own_cache_kinds))

    def _mask(self, positions: torch.Tensor, visible: torch.Tensor, past_len: int):
        """Additive float mask(s) for new tokens at ``positions`` (shape (n,), on the device).

        ``visible``: (n, n) bool, which new tokens each new token may see. The
        cache's ``past_len`` rows sit at positions 0..past_len-1 and are all
        visible, except where a layer kind's window or chunk hides them
        (``AttentionLayout.masks``). Returns a (1, 1, n, past_len + n) tensor in
        the model's dtype (0 = attend, the dtype's lowest value = blocked), or a
        dict of them keyed by layer kind. Built on the device.
        """
        n = positions.shape[0]
        allowed = torch.ones((1, n, past_len + n), dtype=torch.bool, device=positions.device)
        allowed[0, :, past_len:] = visible
        key_pos = torch.cat([torch.arange(past_len, device=positions.device), positions])
        return self.layout.masks(allowed, positions[None], key_pos[None], self.dtype)


def validate_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab_size: int, limit: int | None) -> None:
    """Raise InvalidInputError for prompts the engine cannot serve, before any model work.

    ``input_ids`` and ``attention_mask``: (B, L), mask 1 on real tokens, left padding only
    (one unpadded row: B = 1 and a mask of ones). ``limit``: the model's context (``context_limit``).
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise InvalidInputError(
            f"input_ids and attention_mask must both have shape (B, L); got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    if input_ids.shape[1] == 0:
        raise InvalidInputError("the prompt is empty")
    mask = attention_mask.to(torch.long)
    if bool(((mask != 0) & (mask != 1)).any()):
        raise InvalidInputError("attention_mask must hold only 0 and 1")
    real = mask.sum(dim=1)
    if bool((real == 0).any()):
        raise InvalidInputError("a row of the batch is empty (its attention_mask is all 0)")
    if bool((mask[:, :-1] > mask[:, 1:]).any()):
        raise InvalidInputError("right padding is not supported; tokenize with padding_side='left'")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise InvalidInputError(f"token ids must lie in [0, {vocab_size}); got range [{low}, {high}]")
    if limit is not None and int(real.max()) >= limit:
        raise InvalidInputError(f"a prompt has {int(real.max())} tokens; the model's context holds {limit}")
