"""The plugin's prefix reuse around one call: set up before the prefill, kept and reported after.

``start_reuse`` gives a call its ``PrefixReuse`` (``model.prefix_reuse``): the model's
``PrefixCache`` from ``PluginMemory`` sized to ``prefix_cache_bytes`` (0: off, and emptied),
emptied too when the weights changed since its rows were computed, plus the rows of a cache
the caller prefilled (``model.given_cache``, HF's idiom; it takes precedence).
``finish_reuse`` keeps each row's sequence (prompt and output) in the cache, extends the
caller's one-row cache as HF's ``generate`` would, and writes what was reused into the stats.
"""

from __future__ import annotations

import numpy as np
import torch

from retrieval_draft.decode.stats import DecodeStats
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.model.given_cache import extend_given, given_cache, given_seeds
from retrieval_draft.model.prefix_cache import weights_signature
from retrieval_draft.model.prefix_reuse import PrefixReuse, layout_blocker
from retrieval_draft.model.tree_model import TreeModel


def start_reuse(model, tree_model: TreeModel, memory: PluginMemory, capacity: int, input_ids: torch.Tensor,
                attention_mask: torch.Tensor, model_kwargs: dict) -> PrefixReuse:
    """This call's reuse (to set as ``tree_model.reuse`` before the prefill). ``input_ids`` and
    ``attention_mask``: (B, L), left-padded. Raises ``InvalidInputError`` for a caller's cache it cannot use."""
    rows = input_ids.shape[0]
    prefixes = memory.model(model).prefixes
    prefixes.resize(capacity)
    if capacity > 0:
        prefixes.check(weights_signature(model))
    blocker = layout_blocker(tree_model.layout, rows)
    note = "prefix reuse is off (prefix_cache_bytes=0)" if capacity <= 0 else blocker
    cache = given_cache(model_kwargs)
    given = None
    if cache is not None:
        given = given_seeds(cache, input_ids.cpu(), attention_mask.cpu().to(torch.long))
        if blocker is not None and any(seed is not None for seed in given):
            raise InvalidInputError(f"the cache passed to generate cannot be used with this model: {blocker}")
    return PrefixReuse(prefixes, note, given, caller_cache=cache)


def finish_reuse(reuse: PrefixReuse, tree_model: TreeModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 outputs: list[np.ndarray], stats: DecodeStats) -> None:
    """After decoding: keep every row's sequence (its real prompt tokens, then ``outputs[i]``, shape
    (m_i,)) in the model's cache; extend a caller's one-row, unpadded cache; fill ``stats``."""
    mask = attention_mask.cpu().bool()
    extend = reuse.caller_cache is not None and input_ids.shape[0] == 1 and bool(mask.all())
    if reuse.cache.capacity > 0 or extend:
        rows = reuse.kept_rows(tree_model)
        sequences = [np.concatenate([input_ids[i][mask[i]].cpu().numpy(), out]) for i, out in enumerate(outputs)]
        if reuse.cache.capacity > 0:
            reuse.store(rows, sequences)
        if extend and 0 in rows:
            count = sequences[0].shape[0] - 1
            extend_given(reuse.caller_cache, rows[0][0][:, :, :count], rows[0][1][:, :, :count])
    stats.reused_tokens = reuse.report.reused
    stats.prefilled_tokens = reuse.report.prefilled
    stats.reuse_note = reuse.report.note
    stats.prefix_cache_bytes = reuse.cache.nbytes


def read_ahead(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, memory: PluginMemory,
               capacity: int) -> DecodeStats:
    """Read prompts into the model's prefix cache and generate nothing (an editor warming the cache while
    its user types). ``input_ids`` and ``attention_mask``: (B, L), left-padded. Each row's prompt is kept
    whole (its last token's rows too), so a later call that begins with it reads only what follows.
    Returns the call's statistics (``reused_tokens``, ``prefilled_tokens``, ``prefix_cache_bytes``)."""
    with memory.model(model).lock:
        tree_model = TreeModel(model)
        tree_model.reserve = 1
        tree_model.reuse = start_reuse(model, tree_model, memory, capacity, input_ids, attention_mask, {})
        logits = tree_model.prefill(input_ids, attention_mask)
        # ``store`` keeps a sequence's first n - 1 tokens (the last emitted one has no rows yet): the
        # first token each row would emit closes the sequence, so the whole prompt is kept
        firsts = [np.array([token], dtype=np.int64) for token in logits.argmax(dim=-1).tolist()]
        stats = DecodeStats(rows=input_ids.shape[0])
        finish_reuse(tree_model.reuse, tree_model, input_ids, attention_mask, firsts, stats)
    return stats
