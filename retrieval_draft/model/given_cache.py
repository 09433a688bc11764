"""A KV cache the caller prefilled and passed to ``generate``: HF's own idiom for a shared prefix.

    prompt_cache = DynamicCache()
    model(**tokenizer(prefix, return_tensors="pt"), past_key_values=prompt_cache)  # the first n tokens
    model.generate(**inputs, past_key_values=copy.deepcopy(prompt_cache), custom_generate=retrieval_draft.generate)

``generate`` hands the cache to our callable in ``model_kwargs`` (``cache`` from transformers
5.24, ``past_key_values`` before). It holds the rows of the first n columns of ``input_ids``
(left padding included); row i starts from its real tokens among them (at most all but its
last token) and the prefill runs only the rest (``prefix_reuse``). As HF's ``generate`` does,
a one-row call then extends the cache with the rows of every token but the last (prompt and
output), so a chat can pass the same cache turn after turn; a batch's cache is read, not
extended (HF's would also hold rows of the padding after rows that stopped early, which we
never compute). Caches we cannot read as whole rows raise ``InvalidInputError`` before any
forward: other classes than ``DynamicCache``, sliding-window layers that dropped rows, a
batch size or row count that does not fit the prompt.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from retrieval_draft.errors import InvalidInputError, counted
from retrieval_draft.model.prefix_reuse import RowSeed

CACHE_KWARGS = ("cache", "past_key_values")  # transformers 5.24's name first, then the older one


def given_cache(model_kwargs: dict):
    """The cache the caller passed to ``generate`` (under either name), or None. A cache that
    ``generate`` made itself (empty, and not marked ``_is_user_defined`` as transformers marks
    the caller's) is None too."""
    for name in CACHE_KWARGS:
        cache = model_kwargs.get(name)
        if cache is not None:
            if not isinstance(cache, DynamicCache):
                raise InvalidInputError(
                    f"{name}= takes a DynamicCache holding the prompt's first tokens; got {type(cache).__name__}"
                )
            if getattr(cache, "_is_user_defined", False) or cache.get_seq_length() > 0:
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
