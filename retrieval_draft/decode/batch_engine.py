"""The batch decode loop: every row drafts and accepts on its own, all rows share each forward.

Knows token ids only. Prefill a left-padded batch; then each step asks every
unfinished row's drafters for drafts, plans one tree per row (one width for
all: ``TreePlanner``), scores all trees in ONE forward (``BatchTreeModel``),
verifies each row's tree against its own logits exactly as the single-row
engine does (greedy or lossless sampling, the logits processor seeing that
row's padded sequence as HF's batched ``generate`` shows it), keeps each
row's accepted KV rows, and drops rows that stopped from the batch, so a
finished row costs no more compute.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from retrieval_draft.decode.engine import DecodeOptions, LogitsSink, StopCheck, TokenSink, cut_at_stop, emitted_rows
from retrieval_draft.decode.readout import TreeJob, verify_trees
from retrieval_draft.tree import DraftTree, build_tree
from retrieval_draft.decode.verify import LogitsProcessor, Verdict
from retrieval_draft.drafters.base import Drafter
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.planning.timing import ForwardTimer
from retrieval_draft.target.batch_tree_model import BatchTreeModel
from retrieval_draft.target.row_processors import row_processors


@dataclass
class BatchStats:
    """Per-call statistics of a batch; times in seconds."""

    rows: int = 0
    steps: int = 0
    new_tokens: int = 0
    row_steps: int = 0  # rows verified, summed over steps
    step_tokens: int = 0  # tokens emitted by tree steps (after the prefill's first token per row)
    tree_slots: int = 0  # rows x width, summed over steps: tokens the forwards processed
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0

    def as_dict(self) -> dict:
        """Plain numbers for JSON and printing."""
        decode_s = self.draft_s + self.verify_s
        return {
            "rows": self.rows,
            "steps": self.steps,
            "new_tokens": self.new_tokens,
            "mean_accepted": round(self.step_tokens / self.row_steps, 3) if self.row_steps else 0.0,
            "mean_width": round(self.tree_slots / self.row_steps, 2) if self.row_steps else 0.0,
            "prefill_s": round(self.prefill_s, 4),
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "decode_tokens_per_s": round((self.new_tokens - self.rows) / decode_s, 2) if decode_s else 0.0,
        }


@dataclass(frozen=True)
class RowSinks:
    """Where one row's results go as they come (each optional).

    Attributes:
        on_tokens: the row's new tokens after each step, shape (k,) int64.
        on_logits: the model's raw logits of those tokens, shape (k, V) float32, and the
            row's padded sequence through them, shape (L + m,) (see ``engine.LogitsSink``).
    """

    on_tokens: TokenSink | None = None
    on_logits: LogitsSink | None = None


class _Row:
    """One row's sequence: its padded prompt (``start`` pad slots first), then what it emitted."""

    def __init__(self, prompt: np.ndarray, start: int, drafters: list[Drafter], max_new_tokens: int,
                 processor: LogitsProcessor | None, sinks: RowSinks) -> None:
        self.length = prompt.shape[0]
        self.context = np.empty(self.length + max_new_tokens + 1, dtype=np.int64)
        self.context[: self.length] = prompt
        self.start = start
        self.emitted = self.length
        self.drafters = drafters
        self.processor = processor  # this row's view (``target.row_processors``)
        self.sinks = sinks
        self.done = False
        self.generator: torch.Generator | None = None  # sampling only

    def padded(self) -> np.ndarray:
        """(L + m,) the row as HF's batched ``generate`` holds it: left padding, prompt, output."""
        return self.context[: self.emitted]

    def real(self) -> np.ndarray:
        """(n,) the row's real tokens (no padding): what drafters see."""
        return self.context[self.start : self.emitted]

    def output(self) -> np.ndarray:
        return self.context[self.length : self.emitted].copy()


def batch_decode(
    model: BatchTreeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    row_drafters: list[list[Drafter]],
    options: DecodeOptions,
    planner: TreePlanner,
    processor: LogitsProcessor | None = None,
    generator: torch.Generator | None = None,
    should_stop: StopCheck | None = None,
    sinks: Sequence[RowSinks] | None = None,
) -> tuple[list[np.ndarray], BatchStats]:
    """Generate up to ``options.max_new_tokens`` tokens after each row of a left-padded batch.

    Args:
        input_ids, attention_mask: (B, L) int64; mask 1 on real tokens, left padding only.
        row_drafters: B lists of drafters, one per row (a drafter given to several rows
            must not keep per-generation state; see ``drafters.row_view``).
        generator: seeds one sampling stream per row (each emitted token consumes the same
            randomness whatever the trees look like, so a seed fixes every row's output).
        processor: HF's logits processor for the whole batch; each row verifies with its own
            view of it (``target.row_processors``), seeing its padded sequence as a batch of one.
        should_stop: sees a row's padded sequence (shape (L + m,)) after each new token.
        sinks: B ``RowSinks``, one per row (default: none).

    Returns:
        B arrays of new tokens (shape (m_i,)), and statistics.
    """
    stats = BatchStats(rows=input_ids.shape[0])
    starts = (attention_mask.shape[1] - attention_mask.sum(dim=1)).tolist()
    prompts = input_ids.cpu().numpy()
    count = len(starts)
    processors = row_processors(processor, count)
    sinks = list(sinks) if sinks is not None else [RowSinks()] * count
    rows = [_Row(prompts[i], int(starts[i]), row_drafters[i], options.max_new_tokens, processors[i], sinks[i])
            for i in range(count)]
    for row in rows:
        for drafter in row.drafters:
            drafter.begin(row.real().copy())
        planner.register(row.drafters)

    for row in rows:  # each row draws from its own stream: tree sizes never shift randomness between rows
        row.generator = _row_generator(generator)
    started = time.perf_counter()
    logits = model.prefill(input_ids, attention_mask)
    roots = [build_tree(int(row.context[row.emitted - 1]), [], 0) for row in rows]
    verdicts = _verify(roots, [logits[i][None] for i in range(len(rows))], rows, options)
    for i, (row, verdict) in enumerate(zip(rows, verdicts)):
        _emit(row, np.array([verdict.bonus]), options, should_stop)
        if row.sinks.on_logits is not None:
            row.sinks.on_logits(logits[i][None], row.padded())
    stats.prefill_s = time.perf_counter() - started
    timer = ForwardTimer(logits.device)
    active = _drop_finished(model, rows, list(range(len(rows))))
    while active:
        _step(model, [rows[i] for i in active], options, planner, should_stop, stats, timer)
        active = _drop_finished(model, rows, active)
    outputs = [row.output() for row in rows]
    for row, output in zip(rows, outputs):
        for drafter in row.drafters:
            drafter.end(output)
    stats.new_tokens = sum(output.shape[0] for output in outputs)
    return outputs, stats


def _step(model, rows: list[_Row], options, planner: TreePlanner, should_stop, stats, timer) -> None:
    """One batch step over the unfinished ``rows`` (in the model's row order)."""
    tick = time.perf_counter()
    names = {drafter.name for row in rows for drafter in row.drafters}
    allowed = {name for name in sorted(names) if planner.should_ask(name)}
    asked = [_ask_drafters(row, allowed, options, planner.tree_budget) for row in rows]
    drafts = [[(name, draft) for name, (proposed, _) in row_asked.items() for draft in proposed] for row_asked in asked]
    roots = [int(row.context[row.emitted - 1]) for row in rows]
    trees = [model.verifiable(tree) for tree in planner.plan(roots, drafts)]
    tock = time.perf_counter()
    timer.start()
    logits = model.score_trees(trees)
    timer.stop()
    width = logits.shape[1]
    row_logits = [logits[i, : tree.size] for i, tree in enumerate(trees)]
    verdicts = _verify(trees, row_logits, rows, options)
    planner.observe_forward(len(rows), len(rows) * width, timer.seconds())  # after the verdicts' host read: no extra wait
    model.keep([np.concatenate([[0], verdict.accepted]) for verdict in verdicts])
    truths = []
    for tree, row, verdict, scored in zip(trees, rows, verdicts, row_logits):
        new = np.append(tree.tokens[verdict.accepted], verdict.bonus)
        truths.append(new)
        before = row.emitted
        _emit(row, new, options, should_stop)
        stats.step_tokens += row.emitted - before
        if row.sinks.on_logits is not None:
            row.sinks.on_logits(emitted_rows(scored, verdict, row.emitted - before), row.padded())
    planner.observe(drafts, truths, tock - tick, asked)
    stats.draft_s += tock - tick
    stats.verify_s += time.perf_counter() - tock
    stats.steps += 1
    stats.row_steps += len(rows)
    stats.tree_slots += len(rows) * width


def _ask_drafters(row: _Row, allowed: set[str], options: DecodeOptions, tree_budget: int) -> dict[str, tuple[list, float]]:
    """Row's proposals from the drafters in ``allowed``: drafter name -> (drafts, seconds its ``propose`` took)."""
    remaining = row.length + options.max_new_tokens - row.emitted
    max_len = min(options.max_draft_len, remaining - 1)
    if max_len <= 0 or tree_budget == 0:
        return {}
    asked: dict[str, tuple[list, float]] = {}
    context = row.real()
    for drafter in row.drafters:
        if drafter.name not in allowed:
            continue
        started = time.perf_counter()
        proposed = drafter.propose(context, max_len)
        seconds = time.perf_counter() - started
        earlier, earlier_s = asked.get(drafter.name, ([], 0.0))
        asked[drafter.name] = (earlier + proposed, earlier_s + seconds)
    return asked


def _row_generator(generator: torch.Generator | None) -> torch.Generator | None:
    """A row's own sampling stream, seeded from the call's ``generator`` (None: greedy)."""
    if generator is None:
        return None
    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))


def _verify(trees: list[DraftTree], logits: list[torch.Tensor], rows: list[_Row], options) -> list[Verdict]:
    """Greedy or sampling verification of each row's tree (``logits[i]``: (n_i, V)), the rows'
    tree-observing drafters fed from the same host read (one read for all rows)."""
    jobs = [TreeJob(tree, scored, row.padded(), row.processor, row.generator, [d for d in row.drafters if d.observes_trees])
            for tree, scored, row in zip(trees, logits, rows)]
    return verify_trees(jobs, options.do_sample)


def _emit(row: _Row, new: np.ndarray, options: DecodeOptions, should_stop: StopCheck | None) -> None:
    """Append ``new`` to the row up to its first stop (budget, EOS, a stopping criterion)."""
    limit = row.length + options.max_new_tokens
    new, stop = cut_at_stop(new, row.context, row.emitted, limit, options.eos_ids, should_stop)
    row.context[row.emitted : row.emitted + len(new)] = new
    row.emitted += len(new)
    row.done = stop
    if row.sinks.on_tokens is not None and len(new):
        row.sinks.on_tokens(new)
    for drafter in row.drafters:
        drafter.accept(new)


def _drop_finished(model: BatchTreeModel, rows: list[_Row], active: list[int]) -> list[int]:
    """The still-unfinished rows of ``active`` (row indices in the model's row order);
    finished ones leave the model's batch, which may reorder the others."""
    finished = [position for position, i in enumerate(active) if rows[i].done]
    if not finished:
        return active
    if len(finished) == len(active):
        return []
    return [active[position] for position in model.drop_rows(finished)]
