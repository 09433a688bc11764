"""The decode loop: prefill, then draft / score / verify / keep until a stop.

The engine knows nothing about tokenization: it sees token id sequences
only. Each step drafts a token tree rooted at the pending token (the last
emitted one, whose KV row is not cached yet), scores it in one forward pass,
accepts the longest path the model agrees with plus one bonus token, and
keeps only the accepted KV rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from retrieval_draft.config import DEFAULTS
from retrieval_draft.decode.readout import TreeJob, verify_trees
from retrieval_draft.tree import build_tree
from retrieval_draft.decode.verify import LogitsProcessor, Verdict
from retrieval_draft.drafters.base import Drafter
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.planning.timing import ForwardTimer
from retrieval_draft.target.tree_model import TreeModel


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
        if self.max_draft_len < 1:
            raise InvalidInputError(f"max_draft_len must be at least 1, got {self.max_draft_len}")


@dataclass
class DecodeStats:
    """Per-call statistics; times in seconds."""

    steps: int = 0
    new_tokens: int = 0
    step_tokens: int = 0
    tree_nodes: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0

    @property
    def decode_s(self) -> float:
        """Time after prefill: drafting plus verification."""
        return self.draft_s + self.verify_s

    @property
    def mean_accepted(self) -> float:
        """Tokens emitted per tree step, bonus token included (plain decoding: 1.0)."""
        return self.step_tokens / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        """Plain numbers for JSON and printing."""
        return {
            "steps": self.steps,
            "new_tokens": self.new_tokens,
            "mean_accepted": round(self.mean_accepted, 3),
            "mean_tree_nodes": round(self.tree_nodes / self.steps, 2) if self.steps else 0.0,
            "prefill_s": round(self.prefill_s, 4),
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "decode_tokens_per_s": round(self.new_tokens / self.decode_s, 2) if self.decode_s else 0.0,
        }


TokenSink = Callable[[np.ndarray], None]
StopCheck = Callable[[np.ndarray], bool]
# (raw logits of the k tokens just emitted, shape (k, V) float32; the sequence through them, shape (L + m,))
LogitsSink = Callable[[torch.Tensor, np.ndarray], None]


def speculative_decode(
    model: TreeModel,
    prompt: torch.Tensor,
    drafters: Sequence[Drafter],
    options: DecodeOptions,
    processor: LogitsProcessor | None = None,
    generator: torch.Generator | None = None,
    on_tokens: TokenSink | None = None,
    should_stop: StopCheck | None = None,
    planner: TreePlanner | None = None,
    on_logits: LogitsSink | None = None,
) -> tuple[np.ndarray, DecodeStats]:
    """Generate up to ``options.max_new_tokens`` tokens after ``prompt`` (shape (1, L), int64).

    ``should_stop`` sees the whole sequence (prompt + new, shape (L + m,))
    after each new token and ends generation when it returns True, as HF
    stopping criteria do. ``planner`` sizes each tree (default: a fixed
    ``DEFAULTS.tree_budget`` nodes). ``on_logits`` receives, after each step,
    the model's raw logits for the tokens emitted (row j: the distribution
    token j was chosen from). Returns the new tokens, shape (m,), and statistics.
    """
    stats = DecodeStats()
    planner = planner if planner is not None else TreePlanner(tree_budget=DEFAULTS.tree_budget)
    length = prompt.shape[1]
    context = np.empty(length + options.max_new_tokens + 1, dtype=np.int64)
    context[:length] = prompt[0].cpu().numpy()
    for drafter in drafters:
        drafter.begin(context[:length].copy())
    planner.register(drafters)
    observers = [d for d in drafters if d.observes_trees]

    start = time.perf_counter()
    root_logits = model.prefill(prompt)
    lone_root = build_tree(int(context[length - 1]), [], 0)
    verdict = _verify(lone_root, root_logits[None], context[:length], options, processor, generator, observers)
    stats.prefill_s = time.perf_counter() - start
    timer = ForwardTimer(root_logits.device)

    emitted = length
    done, emitted = _emit(np.array([verdict.bonus]), context, emitted, length, options, should_stop, on_tokens, drafters)
    if on_logits is not None:
        on_logits(root_logits[None, :], context[:emitted])
    while not done:
        remaining = length + options.max_new_tokens - emitted
        tick = time.perf_counter()
        asked = _ask_drafters(drafters, context[:emitted], remaining, options, planner)
        drafts = [(name, draft) for name, (proposed, _) in asked.items() for draft in proposed]
        tree = model.verifiable(planner.plan([int(context[emitted - 1])], [drafts])[0])
        tock = time.perf_counter()
        timer.start()
        logits = model.score_tree(tree)
        timer.stop()
        verdict = _verify(tree, logits, context[:emitted], options, processor, generator, observers)
        planner.observe_forward(1, tree.size, timer.seconds())  # after the verdict's host read: no extra wait
        model.keep(np.concatenate([[0], verdict.accepted]))
        new = np.append(tree.tokens[verdict.accepted], verdict.bonus)
        planner.observe([drafts], [new], tock - tick, [asked])
        stats.draft_s += tock - tick
        stats.verify_s += time.perf_counter() - tock
        stats.steps += 1
        stats.tree_nodes += tree.size
        before = emitted
        done, emitted = _emit(new, context, emitted, length, options, should_stop, on_tokens, drafters)
        stats.step_tokens += emitted - before
        if on_logits is not None:
            on_logits(emitted_rows(logits, verdict, emitted - before), context[:emitted])
    stats.new_tokens = emitted - length
    output = context[length:emitted].copy()
    for drafter in drafters:
        drafter.end(output)
    return output, stats


def _ask_drafters(
    drafters: Sequence[Drafter], context: np.ndarray, remaining: int, options: DecodeOptions, planner: TreePlanner
) -> dict[str, tuple[list, float]]:
    """Proposals of the drafters the planner's gate lets through this step, no longer than
    the tokens left allow: drafter name -> (its drafts, seconds its ``propose`` took)."""
    max_len = min(options.max_draft_len, remaining - 1)
    if max_len <= 0 or planner.tree_budget == 0:
        return {}
    asked: dict[str, tuple[list, float]] = {}
    for drafter in drafters:
        if not planner.should_ask(drafter.name):
            continue
        started = time.perf_counter()
        proposed = drafter.propose(context, max_len)
        seconds = time.perf_counter() - started
        earlier, earlier_s = asked.get(drafter.name, ([], 0.0))  # two drafters of one name share an entry
        asked[drafter.name] = (earlier + proposed, earlier_s + seconds)
    return asked


def emitted_rows(logits: torch.Tensor, verdict: Verdict, count: int) -> torch.Tensor:
    """Rows of tree ``logits`` (n, V) that chose the first ``count`` emitted tokens: (count, V).

    The first accepted node was chosen at the root, each later one at its
    parent, the bonus token at the last accepted node.
    """
    rows = np.concatenate([[0], verdict.accepted])[:count]
    return logits[torch.from_numpy(rows).to(logits.device)]


def _verify(tree, logits, context, options, processor, generator, observers) -> Verdict:
    """Greedy or sampling verification of ``tree`` (``logits``: (n, V)); ``context`` (shape (L,))
    runs through the root. ``observers`` record the tree from the same host read."""
    return verify_trees([TreeJob(tree, logits, context, processor, generator, observers)], options.do_sample)[0]


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
    if eos_ids:
        hits = np.flatnonzero(np.isin(new, list(eos_ids)))
        if hits.size:
            new, stop = new[: hits[0] + 1], True
    if should_stop is not None:
        for i in range(len(new)):
            context[emitted + i] = new[i]
            if should_stop(context[: emitted + i + 1]):
                new, stop = new[: i + 1], True
                break
    return new, stop


def _emit(new, context, emitted, length, options, should_stop, on_tokens, drafters) -> tuple[bool, int]:
    """Append ``new`` tokens up to the first stop (``cut_at_stop``); return (stopped, new emitted count)."""
    new, stop = cut_at_stop(new, context, emitted, length + options.max_new_tokens, options.eos_ids, should_stop)
    context[emitted : emitted + len(new)] = new
    if on_tokens is not None and len(new):
        on_tokens(new)
    for drafter in drafters:
        drafter.accept(new)
    return stop, emitted + len(new)
