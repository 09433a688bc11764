"""One batch row's view of HF's logits processors.

Verification applies the processor to one row at a time, as a batch of one:
``processor(ids, scores)`` with ``ids`` of shape (1, L), the row's padded
sequence through a tree node. Most HF processors hold nothing per batch row,
so the call's own list serves every row. A few hold per-row state built for
the whole batch by ``generate`` and must see only their row's share:

- ``RepetitionPenaltyLogitsProcessor.prompt_ignore_length``: (B,) pad count
  per row (HF ignores a row's left padding with it);
- ``PrefixConstrainedLogitsProcessor``: its function takes the batch row's
  index, which a batch of one would always give as 0.

``row_processors`` copies those (shallowly) with their state cut to one row
and keeps every other processor as it is.
"""

from __future__ import annotations

import copy

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList, PrefixConstrainedLogitsProcessor, RepetitionPenaltyLogitsProcessor,
)


def row_processors(processor, rows: int) -> list:
    """``rows`` processors, row i's applying ``processor`` to row i alone (ids of shape (1, L)).

    Returns ``[processor] * rows`` when nothing in it holds per-row state (or it is None).
    """
    if processor is None or rows == 1 or not any(_per_row(p) for p in processor):
        return [processor] * rows
    return [LogitsProcessorList([_for_row(p, row) for p in processor]) for row in range(rows)]


def _per_row(processor) -> bool:
    """Whether ``processor`` holds state indexed by batch row."""
    if isinstance(processor, RepetitionPenaltyLogitsProcessor):
        return isinstance(processor.prompt_ignore_length, torch.Tensor)
    return isinstance(processor, PrefixConstrainedLogitsProcessor)


def _for_row(processor, row: int):
    """``processor`` as row ``row``'s batch of one sees it (itself when it holds no per-row state)."""
    if not _per_row(processor):
        return processor
    view = copy.copy(processor)
    if isinstance(processor, RepetitionPenaltyLogitsProcessor):
        view.prompt_ignore_length = processor.prompt_ignore_length[row : row + 1]
    else:
        allowed = processor._prefix_allowed_tokens_fn
        view._prefix_allowed_tokens_fn = lambda batch_id, ids: allowed(row + batch_id, ids)
    return view
