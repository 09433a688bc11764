"""The ``generate`` plugin's batch path: several (left-padded) rows in one call.

    inputs = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt")
    model.generate(**inputs, custom_generate=retrieval_draft.generate, max_new_tokens=N)

``hf.generate`` routes here when ``input_ids`` has more than one row or the
attention mask shows padding. The result has the shape and content of HF's
batched ``generate``: (B, L + m) with m the most new tokens of any row, and a
row that stopped early (EOS, a stopping criterion) filled with ``pad_token_id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from retrieval_draft.config import DraftConfig
from retrieval_draft.decode.batch_engine import BatchStats, RowSinks, batch_decode
from retrieval_draft.decode.engine import DecodeOptions, DecodeStats, StopCheck
from retrieval_draft.drafters.base import Drafter
from retrieval_draft.drafters.row_view import per_row
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.hf_options import ScoreRecorder, build_output, score_recorder
from retrieval_draft.memory import PluginMemory
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.target.batch_tree_model import BatchTreeModel
from retrieval_draft.target.generate_kwargs import eos_token_ids, pad_token_id
from retrieval_draft.target.row_processors import row_processors


def is_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Whether a call takes the batch path: several rows, or padding in the mask."""
    padded = attention_mask is not None and not bool(attention_mask.all())
    return input_ids.dim() == 2 and (input_ids.shape[0] > 1 or padded)


@dataclass(frozen=True)
class BatchCall:
    """What ``hf.generate`` hands the batch path besides ``generate``'s own arguments.

    Attributes:
        config: the drafting settings.
        memory: the plugin memory (model lock, learned rates).
        make_drafters: one row's default drafters (called once per row; instances kept
            across calls, such as the output history, come back shared).
        make_planner: the call's single-row planner (shared rates, cost curve, budget).
        drafters: the caller's ``drafters=``: one list for every row, or one list per row.
        generator: the sampling generator, or None for greedy.
        should_stop: per-token check of the stopping criteria beyond EOS and length.
        streamer: the caller's ``draft_streamer=``: for a batch, one HF streamer per row.
        saves_learned: whether to write learned rates to disk after the call.
    """

    config: DraftConfig
    memory: PluginMemory
    make_drafters: Callable[[], list[Drafter]]
    make_planner: Callable[[], TreePlanner]
    drafters: Sequence | None = None
    generator: torch.Generator | None = None
    should_stop: StopCheck | None = None
    streamer: object | None = None
    saves_learned: bool = False


def generate_batch(model, input_ids, attention_mask, generation_config, logits_processor, call: BatchCall,
                   stats: DecodeStats | None = None):
    """Batched ``generate``: returns (B, L + m) sequences, or HF's output class around them."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    max_new_tokens = int(generation_config.max_length) - input_ids.shape[1]
    limit = getattr(model.config, "max_position_embeddings", None)
    validate_batch(input_ids, attention_mask, max_new_tokens, model.config.vocab_size, limit)
    streamers = row_streamers(call.streamer, input_ids.shape[0])
    options = DecodeOptions(
        max_new_tokens=max_new_tokens,
        eos_ids=eos_token_ids(generation_config),
        max_draft_len=call.config.max_draft_len,
        do_sample=bool(generation_config.do_sample),
    )
    rows = input_ids.shape[0]
    given = row_lists(call.drafters, rows) if call.drafters is not None else None
    drafters = per_row(given if given is not None else [call.make_drafters() for _ in range(rows)])
    recorders = [score_recorder(generation_config, view) for view in row_processors(logits_processor, rows)]
    sinks = [_sinks(streamer, recorder) for streamer, recorder in zip(streamers, recorders)]
    with call.memory.model(model).lock:
        for row, streamer in enumerate(streamers):
            if streamer is not None:
                streamer.put(input_ids[row : row + 1, attention_mask[row].bool()].cpu())
        planner = call.make_planner()
        measured = planner.cost.skinny_sizes if planner.cost is not None else None
        outputs, batch_stats = batch_decode(
            BatchTreeModel(model, skinny_sizes=measured),
            input_ids.cpu(),
            attention_mask.cpu(),
            drafters,
            options,
            planner,
            processor=logits_processor,
            generator=call.generator,
            should_stop=call.should_stop,
            sinks=sinks,
        )
        for streamer in streamers:
            if streamer is not None:
                streamer.end()
        if call.saves_learned:
            call.memory.save_learned(model)
    if stats is not None:
        _fill(stats, batch_stats)
    sequences = padded_sequences(input_ids, outputs, pad_token_id(generation_config, options.eos_ids))
    return build_output(sequences.to(input_ids.device), generation_config, recorders)


def row_streamers(streamer, rows: int) -> list:
    """``draft_streamer=`` as one streamer (or None) per row: a batch takes a list of ``rows``
    streamers, each fed its row's prompt (real tokens, shape (1, n)), new tokens and ``end``."""
    if streamer is None:
        return [None] * rows
    if not isinstance(streamer, (list, tuple)) or len(streamer) != rows:
        raise InvalidInputError(f"draft_streamer for a batch of {rows} rows takes a list of {rows} streamers, one per row")
    return list(streamer)


def _sinks(streamer, recorder: ScoreRecorder | None) -> RowSinks:
    """One row's sinks: its streamer's ``put`` for new tokens, its recorder for scores and logits."""
    on_tokens = (lambda tokens: streamer.put(torch.from_numpy(tokens))) if streamer is not None else None
    return RowSinks(on_tokens=on_tokens, on_logits=recorder)


def row_lists(drafters: Sequence, rows: int) -> list[list[Drafter]]:
    """``drafters=`` as one list per row: a flat list of drafters serves every row."""
    items = list(drafters)
    if all(isinstance(item, Drafter) for item in items):
        return [items for _ in range(rows)]
    if len(items) != rows or not all(isinstance(item, (list, tuple)) for item in items):
        raise InvalidInputError(f"drafters= must be one list of drafters, or one list per row ({rows} rows)")
    return [list(item) for item in items]


def validate_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, vocab_size: int,
                   limit: int | None) -> None:
    """Raise InvalidInputError for a batch the engine cannot serve (before any model work)."""
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise InvalidInputError(
            f"input_ids and attention_mask must both have shape (B, L); got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    if max_new_tokens < 1:
        raise InvalidInputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
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


def padded_sequences(input_ids: torch.Tensor, outputs: list[np.ndarray], pad: int) -> torch.Tensor:
    """(B, L + m): each row's prompt and new tokens, rows shorter than the longest filled with ``pad``."""
    longest = max(output.shape[0] for output in outputs)
    tail = np.full((len(outputs), longest), pad, dtype=np.int64)
    for row, output in enumerate(outputs):
        tail[row, : output.shape[0]] = output
    return torch.cat([input_ids.cpu(), torch.from_numpy(tail)], dim=1)


def _fill(stats: DecodeStats, batch: BatchStats) -> None:
    """A batch's statistics in the single-row fields (a step = one row verified once)."""
    stats.steps = batch.row_steps
    stats.new_tokens = batch.new_tokens
    stats.step_tokens = batch.step_tokens
    stats.tree_nodes = batch.tree_slots
    stats.prefill_s = batch.prefill_s
    stats.draft_s = batch.draft_s
    stats.verify_s = batch.verify_s
