"""The decode loop over B rows: prefill, then draft / score / verify / keep until every row stops.

Knows token ids only. Prefill a left-padded batch (one prompt is a batch of
one); then each step asks every unfinished row's drafters for drafts, plans
one tree per row (``TreePlanner``: one width for all), scores all trees in ONE
forward (``TreeModel``), verifies each row's tree against its own logits
(greedy exact match or lossless speculative sampling; the logits processor
sees that row's padded sequence as HF's batched ``generate`` shows it), keeps
each row's accepted KV rows plus one bonus token, and drops rows that stopped
from the batch, so a finished row costs no more compute. A tree is rooted at
its row's pending token (the last emitted one, whose KV row is not cached yet).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch

from retrieval_draft.config import DEFAULTS, check_setting
from retrieval_draft.decode.verify import LogitsProcessor, TreeJob, Verdict, verify_trees
from retrieval_draft.draft import Drafter, Proposals
from retrieval_draft.errors import InvalidInputError, counted
from retrieval_draft.model.row_processors import row_processors
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.planning.timing import ForwardTimer
from retrieval_draft.tree import DraftTree, lone_root


@dataclass(frozen=True)
class DecodeOptions:
    """How one generation runs.

    Attributes:
        max_new_tokens: stop after this many new tokens.
        eos_ids: generation stops right after emitting any of these.
        max_draft_len: deepest draft path, in tokens (the node budget is the
            planner's ``tree_budget``).
        do_sample: sample (lossless speculative sampling) instead of greedy.
    """

    max_new_tokens: int
    eos_ids: frozenset[int] = frozenset()
    max_draft_len: int = DEFAULTS.max_draft_len
    do_sample: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise InvalidInputError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        object.__setattr__(self, "max_draft_len", check_setting("max_draft_len", self.max_draft_len))



@dataclass
class DecodeStats:
    """Per-call statistics; times in seconds. A step is one row verified once: B rows
    decoding together take B steps per forward.

    A forward's host time splits into phases: ``draft_s`` (drafters' proposals), ``plan_s``
    (merging, sizing and pruning the trees), ``pack_s`` (tokens, positions and masks to the
    device), ``forward_s`` (the model call: on CPU the forward itself, on a GPU its launch),
    ``readout_s`` (the host read, verification, tree observers) and ``accept_s`` (cache keep,
    emitting: stop checks, streamers, drafters' ``accept``, learning).

    Prefix reuse (``model.prefix_cache``): ``reused_tokens`` prompt tokens started from KV rows
    of earlier calls (or of a cache the caller passed), ``prefilled_tokens`` run by the prefill,
    both summed over rows; ``reuse_note`` says why rows were not reused or kept (reuse off, a
    cache layout), else None; ``prefix_cache_bytes`` is what the model's cache holds after the call."""

    rows: int = 0
    forwards: int = 0  # tree forwards (batch steps)
    steps: int = 0  # rows verified, summed over forwards
    new_tokens: int = 0  # every row's new tokens, the prefill's first token included
    step_tokens: int = 0  # tokens emitted by tree steps (after the prefill's first token per row)
    tree_nodes: int = 0  # real tree nodes verified, summed over steps
    tree_slots: int = 0  # rows x width, summed over forwards: tokens the forwards processed
    probe_forwards: int = 0  # forwards that timed a size for the cost curve's measurement (``CostProbe``)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    plan_s: float = 0.0
    pack_s: float = 0.0
    forward_s: float = 0.0
    readout_s: float = 0.0
    accept_s: float = 0.0
    device_forward_s: float = 0.0  # the forwards as the device timed them (``ForwardTimer``: CUDA events on a GPU)
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    reuse_note: str | None = None
    prefix_cache_bytes: int = 0

    @property
    def verify_s(self) -> float:
        """Time after drafting: planning, packing, the forward, readout and accepting."""
        return self.plan_s + self.pack_s + self.forward_s + self.readout_s + self.accept_s

    @property
    def decode_s(self) -> float:
        """Time after prefill: drafting plus verification."""
        return self.draft_s + self.verify_s

    @property
    def host_s(self) -> float:
        """Time after prefill outside the forward as the device ran it (``decode_s - device_forward_s``):
        on CPU everything but the model call; on a GPU, where the call only launches the forward and
        the readout waits for it, the host work the forward did not hide."""
        return self.decode_s - self.device_forward_s

    @property
    def mean_accepted(self) -> float:
        """Tokens emitted per step, bonus token included (plain decoding: 1.0)."""
        return self.step_tokens / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        """Plain numbers for JSON and printing."""
        phases = ("draft_s", "plan_s", "pack_s", "forward_s", "readout_s", "accept_s", "device_forward_s")
        return {
            "rows": self.rows,
            "forwards": self.forwards,
            "probe_forwards": self.probe_forwards,
            "steps": self.steps,
            "new_tokens": self.new_tokens,
            "mean_accepted": round(self.mean_accepted, 3),
            "mean_tree_nodes": round(self.tree_nodes / self.steps, 2) if self.steps else 0.0,
            "mean_width": round(self.tree_slots / self.steps, 2) if self.steps else 0.0,
            "prefill_s": round(self.prefill_s, 4),
            **{name: round(getattr(self, name), 5) for name in phases},
            "verify_s": round(self.verify_s, 4),
            "host_s": round(self.host_s, 5),
            "decode_tokens_per_s": round(self.step_tokens / self.decode_s, 2) if self.decode_s else 0.0,
            "reused_tokens": self.reused_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "reuse_note": self.reuse_note,
            "prefix_cache_bytes": self.prefix_cache_bytes,
        }


class TreeScorer(Protocol):
    """B rows of a batch, each with its cached tokens; trees are scored one step at a time.

    Attributes:
        skinny_sizes: forward sizes (rows x width) that take the CPU skinny matmul; the engine
            sets it each step from the planner (``TreePlanner.matmul_sizes``), a model
            without that path ignores it.
    """

    skinny_sizes: frozenset

    @property
    def rows(self) -> int:
        """B, the rows in the batch."""

    @property
    def length(self) -> int:
        """T, the cache slots in use (the longest row's end)."""

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run (B, L) left-padded prompts into a fresh cache; the last position's logits, (B, V) float32."""

    def verifiable(self, tree: DraftTree) -> DraftTree:
        """``tree`` as this model can score it (its best chain where trees cannot be scored)."""

    def pack(self, trees: list[DraftTree]) -> Any:
        """Row i's tree ``trees[i]`` as the forward's inputs (host work, nothing cached)."""

    def score(self, packed: Any) -> torch.Tensor:
        """One forward over packed trees: logits (B, W, V) float32, W = the largest tree."""

    def keep(self, nodes: list[np.ndarray]) -> None:
        """Keep row i's tree nodes ``nodes[i]`` (increasing, a path from root 0) in the cache."""

    def drop_rows(self, finished: list[int]) -> list[int]:
        """Remove rows ``finished``; for each remaining row in its new place, its index before."""


TokenSink = Callable[[np.ndarray], None]
StopCheck = Callable[[np.ndarray], bool]
# (raw logits of the k tokens just emitted, shape (k, V) float32; the row's padded sequence through them, shape (L + m,))
LogitsSink = Callable[[torch.Tensor, np.ndarray], None]


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
        self.observers = [drafter for drafter in drafters if drafter.observes_trees]  # they record verified trees
        self.proposals = Proposals([drafter.name for drafter in drafters])  # this row's drafts, step by step
        self.processor = processor  # this row's view (``model.row_processors``)
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


def speculative_decode(
    model: TreeScorer,
    input_ids: torch.Tensor,
    drafters: Sequence[Sequence[Drafter]],
    options: DecodeOptions,
    attention_mask: torch.Tensor | None = None,
    planner: TreePlanner | None = None,
    processor: LogitsProcessor | None = None,
    generator: torch.Generator | None = None,
    should_stop: StopCheck | None = None,
    sinks: Sequence[RowSinks] | None = None,
) -> tuple[list[np.ndarray], DecodeStats]:
    """Generate up to ``options.max_new_tokens`` tokens after each row of a left-padded batch.

    Args:
        input_ids: (B, L) int64 prompts; one prompt is (1, L).
        drafters: B lists of drafters, one per row; a drafter may serve several rows (each
            row runs on its own handle, ``Drafter.for_row``).
        attention_mask: (B, L), 1 on real tokens, left padding only (None: no padding).
        planner: sizes each row's tree (default: a fixed ``DEFAULTS.tree_budget`` nodes).
        processor: HF's logits processor for the whole batch; each row verifies with its own
            view of it (``model.row_processors``), seeing its padded sequence as a batch of one.
        generator: one row samples from it; several rows each from a stream seeded from it (each
            emitted token consumes the same randomness whatever the trees look like, so a seed
            fixes every row's output).
        should_stop: sees a row's padded sequence (shape (L + m,)) after each new token and
            ends that row when it returns True, as HF stopping criteria do.
        sinks: B ``RowSinks``, one per row (default: none).

    Returns:
        B arrays of new tokens (shape (m_i,)), and statistics.
    """
    if len(drafters) != input_ids.shape[0]:
        raise InvalidInputError(
            f"{counted(len(drafters), 'drafter list')} for {counted(input_ids.shape[0], 'row')}: pass one list per row"
        )
    planner = planner if planner is not None else TreePlanner(tree_budget=DEFAULTS.tree_budget)
    stats = DecodeStats(rows=input_ids.shape[0])
    if attention_mask is None:  # no padding: every row starts at slot 0
        starts = [0] * input_ids.shape[0]
    else:
        attention_mask = attention_mask.cpu()
        starts = (attention_mask.shape[1] - attention_mask.sum(dim=1)).tolist()
    prompts = input_ids.cpu().numpy()
    count = len(starts)
    processors = row_processors(processor, count)
    sinks = list(sinks) if sinks is not None else [RowSinks()] * count
    rows = [_Row(prompts[i], int(starts[i]), [d.for_row(i) for d in drafters[i]], options.max_new_tokens,
                 processors[i], sinks[i]) for i in range(count)]
    planner.begin()
    for row in rows:
        for drafter in row.drafters:
            drafter.begin(row.real().copy())
        planner.register(row.drafters)

    for row in rows:  # each row draws from its own stream: tree sizes never shift randomness between rows
        row.generator = _row_generator(generator)
    started = time.perf_counter()
    logits = model.prefill(input_ids, attention_mask)
    roots = [lone_root(int(row.context[row.emitted - 1])) for row in rows]
    verdicts = _verify(roots, logits[:, None], rows, options)
    for i, (row, verdict) in enumerate(zip(rows, verdicts)):
        _emit(row, np.array([verdict.bonus]), options, should_stop)
        if row.sinks.on_logits is not None:
            row.sinks.on_logits(logits[i][None], row.padded())
    stats.prefill_s = time.perf_counter() - started
    run = _Run(model, options, planner, should_stop, stats, ForwardTimer(logits.device))
    active = _drop_finished(model, rows, list(range(len(rows))))
    while active:
        _step(run, [rows[i] for i in active])
        active = _drop_finished(model, rows, active)
    outputs = [row.output() for row in rows]
    for row, output in zip(rows, outputs):
        for drafter in row.drafters:
            drafter.end(output)
    stats.new_tokens = sum(output.shape[0] for output in outputs)
    return outputs, stats


@dataclass(frozen=True)
class _Run:
    """What every step of one generation shares: the model, the options, the planner, the stop
    check beyond EOS and length, the statistics it fills and the forward timer."""

    model: TreeScorer
    options: DecodeOptions
    planner: TreePlanner
    should_stop: StopCheck | None
    stats: DecodeStats
    timer: ForwardTimer


def _step(run: _Run, rows: list[_Row]) -> None:
    """One batch step over the unfinished ``rows`` (in the model's row order), its phases timed
    into ``run.stats``."""
    model, options, planner, stats, timer = run.model, run.options, run.planner, run.stats, run.timer
    clock = time.perf_counter
    started = clock()
    names = {drafter.name for row in rows for drafter in row.drafters}
    allowed = {name for name in sorted(names) if planner.should_ask(name)}
    for row in rows:
        _ask_drafters(row, allowed, options, planner.tree_budget)
    proposals = [row.proposals for row in rows]
    drafted = clock()
    roots = [int(row.context[row.emitted - 1]) for row in rows]
    cache_len = model.length
    plan = planner.plan(roots, proposals, cache_len)
    trees = [model.verifiable(tree) for tree in plan.trees]
    if plan.matmul_sizes is not None:
        model.skinny_sizes = plan.matmul_sizes
    planned = clock()
    packed = model.pack(trees)
    launched = clock()
    timer.start()
    logits = model.score(packed)
    timer.stop()
    scored = clock()
    width = logits.shape[1]
    verdicts = _verify(trees, logits, rows, options)
    read = clock()
    forward_seconds = timer.seconds()  # after the verdicts' host read: no extra wait
    planner.observe_forward(len(rows), len(rows) * width, forward_seconds, cache_len, plan)
    model.keep([verdict.kept_nodes() for verdict in verdicts])
    truths = []
    for i, (tree, row, verdict) in enumerate(zip(trees, rows, verdicts)):
        new = verdict.new_tokens(tree.tokens)
        truths.append(new)
        before = row.emitted
        _emit(row, new, options, run.should_stop)
        stats.step_tokens += row.emitted - before
        if row.sinks.on_logits is not None:
            row.sinks.on_logits(emitted_rows(logits[i, : tree.size], verdict, row.emitted - before), row.padded())
    planner.observe(proposals, truths, planned - started, plan)
    stats.draft_s += drafted - started
    stats.plan_s += planned - drafted
    stats.pack_s += launched - planned
    stats.forward_s += scored - launched
    stats.readout_s += read - scored
    stats.accept_s += clock() - read
    stats.device_forward_s += forward_seconds
    stats.forwards += 1
    stats.probe_forwards += plan.probing is not None
    stats.steps += len(rows)
    stats.tree_nodes += sum(tree.size for tree in trees)
    stats.tree_slots += len(rows) * width


def _ask_drafters(row: _Row, allowed: set[str], options: DecodeOptions, tree_budget: int) -> None:
    """The row's drafts this step, from the drafters in ``allowed``, into ``row.proposals``
    (with each drafter's ``propose`` seconds)."""
    proposals = row.proposals
    proposals.clear()
    remaining = row.length + options.max_new_tokens - row.emitted
    max_len = min(options.max_draft_len, remaining - 1)
    if max_len <= 0 or tree_budget == 0:
        return
    context = row.real()
    for drafter in row.drafters:
        if drafter.name not in allowed:
            continue
        started = time.perf_counter()
        drafter.propose_into(context, max_len, proposals.writer(drafter.name))
        proposals.took(time.perf_counter() - started)


def _row_generator(generator: torch.Generator | None) -> torch.Generator | None:
    """A row's own sampling stream, seeded from the call's ``generator`` (None: greedy), one
    prompt as each row of a batch: a seed fixes every row's output."""
    if generator is None:
        return None
    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))


def _verify(trees: list[DraftTree], logits: torch.Tensor, rows: list[_Row], options) -> list[Verdict]:
    """Greedy or sampling verification of each row's tree (``logits``: (B, W, V), row ``i``'s
    tree scored by ``logits[i, :n_i]``), the rows' tree-observing drafters that were asked this
    step fed from the same host read (one read for all rows); what observing cost each is
    charged to it in the row's proposals (the gate weighs it)."""
    jobs = [TreeJob(tree, row.padded(), row.processor, row.generator,
                    [d for d in row.observers if row.proposals.was_asked(d.name)])
            for tree, row in zip(trees, rows)]
    verdicts, observed = verify_trees(jobs, logits, options.do_sample)
    for spent, row in zip(observed, rows):
        for name, seconds in spent.items():
            row.proposals.charge(name, seconds)
    return verdicts


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


def _drop_finished(model: TreeScorer, rows: list[_Row], active: list[int]) -> list[int]:
    """The still-unfinished rows of ``active`` (row indices in the model's row order);
    finished ones leave the model's batch, which may reorder the others."""
    finished = [position for position, i in enumerate(active) if rows[i].done]
    if not finished:
        return active
    if len(finished) == len(active):
        return []
    return [active[position] for position in model.drop_rows(finished)]


def emitted_rows(logits: torch.Tensor, verdict: Verdict, count: int) -> torch.Tensor:
    """Rows of tree ``logits`` (n, V) that chose the first ``count`` emitted tokens: (count, V).

    The first accepted node was chosen at the root, each later one at its
    parent, the bonus token at the last accepted node.
    """
    return logits[torch.tensor(verdict.kept_nodes()[:count], device=logits.device)]


def cut_at_stop(
    new: np.ndarray, context: np.ndarray, emitted: int, limit: int, eos_ids: frozenset[int], should_stop: StopCheck | None
) -> tuple[np.ndarray, bool]:
    """The part of ``new`` (shape (k,)) to emit after ``context[:emitted]``, and whether generation stops.

    Nothing after an EOS token, the token budget (``limit``, the context
    length where generation must end) or a stopping criterion's first True
    is emitted. ``should_stop`` sees the context through each new token, so
    those tokens are written into ``context`` as they are checked.
    """
    new = new[: limit - emitted]
    stop = len(new) > 0 and emitted + len(new) >= limit
    if eos_ids:  # a step emits a few tokens: a set lookup each beats np.isin's set-up
        hit = next((i for i, token in enumerate(new.tolist()) if token in eos_ids), None)
        if hit is not None:
            new, stop = new[: hit + 1], True
    if should_stop is not None:
        for i in range(len(new)):
            context[emitted + i] = new[i]
            if should_stop(context[: emitted + i + 1]):
                new, stop = new[: i + 1], True
                break
    return new, stop
