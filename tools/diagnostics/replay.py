"""Replay greedy outputs through the real decode engine, with a stand-in for the model.

Under greedy decoding the tokens the model will emit are known in advance
(``python -m tools.diagnostics.fit_priors --refs`` saves them), so a decode can be replayed
without a forward pass: ``ReplayModel`` offers what ``speculative_decode``
needs from ``TreeModel`` for one row (``prefill``, ``score_trees``, ``keep``) and answers
with one-hot logits read off the saved output. The engine, its drafters
(chosen from the registry), the tree planner (which learns as it would
live) and greedy verification are the real ones, so the replay reproduces
the saved output exactly. Time is modelled: each step costs the cost curve
at its tree size (measured with ``--measure``, or the default below from the
2-core CPU of shared/DESIGN.md) plus ``STEP_OVERHEAD_S``; the "speedup" is an
estimate for tuning, not a benchmark (timed claims come from ``tools.bench``).
The stand-in's forwards take no time, so the planner's corrections of the
cost curve from observed forward times are switched off here.

``--ceiling`` also reports the clairvoyant bound: each step verifies just
the accepted part of the best single candidate among the same drafters'
proposals (``CeilingDrafter``; fixed-size planning, no cost model).
Greedy only: sampled outputs cannot be replayed from one saved sequence.

    python -m tools.diagnostics.replay --refs refs.json [--datastore DIR] [--history FILE]
                           [--drafters prompt,ngram,...] [--ceiling]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from retrieval_draft.config import DEFAULTS
from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.tree import DraftTree
from retrieval_draft.draft import Draft, Drafter
from retrieval_draft.drafters.registry import DRAFTERS, DraftSources, default_names, make_drafters
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.planning.cost import ObservedCost, VerifyCost
from retrieval_draft.planning.planner import TreePlanner

# ms per forward over k new tokens after a 256-token cache, SmolLM2-135M, 2 cores, torch 2.13,
# with the in-place KV cache, grouped tree attention and the skinny matmul for 4-15 nodes
# (``measure_cost``, now ``retrieval_draft.planning.cost_probe.measure_cost``, 5 repeats, 2026-11-22).
DEFAULT_CURVE = VerifyCost.from_points(
    (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64),
    np.array((31.6, 32.4, 34.7, 42.4, 46.5, 52.0, 60.2, 68.1, 77.8, 84.5, 99.4, 123.9)) / 1000,
)
STEP_OVERHEAD_S = 0.0012  # drafting and bookkeeping per step, measured by the bench's drafting share


class ReplayModel:
    """Stands in for ``TreeModel`` (a ``decode.engine.TreeScorer``) when the greedy output is known: no forward passes.

    It serves a batch of one row. Row i of a tree's logits puts its maximum on the reference token
    that follows node i when the path through node i is the reference so
    far; on any other path (and past the reference's end) on ``miss``, an id
    that never occurs in the reference. ``past_len`` counts the tokens
    "cached", as ``TreeModel``'s does; ``sizes`` records every scored tree's size.

    Args:
        reference: shape (N,), int64, the prompt followed by the saved greedy output.
        vocab_size: width of the logits rows; default one more than ``miss``.
    """

    def __init__(self, reference: np.ndarray, vocab_size: int | None = None) -> None:
        self.reference = np.asarray(reference, dtype=np.int64).reshape(-1)
        self.miss = int(self.reference.max()) + 1
        self.vocab_size = self.miss + 1 if vocab_size is None else vocab_size
        if self.vocab_size <= self.miss:
            raise ValueError(f"vocab_size {self.vocab_size} leaves no id outside the reference")
        self.past_len = 0
        self.sizes: list[int] = []

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Take the prompt (shape (1, L), the reference's first L ids, unpadded); logits after it, shape (1, V)."""
        prompt = input_ids[0].cpu().numpy()
        if not np.array_equal(prompt, self.reference[: prompt.shape[0]]):
            raise ValueError("the prompt is not the start of the reference")
        self.past_len = int(prompt.shape[0])
        return self._one_hot(np.array([self._next(self.past_len)]))

    @property
    def length(self) -> int:
        """Cached tokens (``TreeModel.length`` of one row)."""
        return self.past_len

    def verifiable(self, tree: DraftTree) -> DraftTree:
        """``tree`` itself: the stand-in scores any tree shape."""
        return tree

    @property
    def rows(self) -> int:
        """One row (``TreeScorer.rows``)."""
        return 1

    def pack(self, trees: list[DraftTree]) -> list[DraftTree]:
        """The trees themselves: nothing to move to a device."""
        return trees

    def score_trees(self, trees: list[DraftTree]) -> torch.Tensor:
        """``score(pack(trees))``."""
        return self.score(self.pack(trees))

    def drop_rows(self, finished: list[int]) -> list[int]:
        """The one row finished: none remain."""
        return []

    def score(self, trees: list[DraftTree]) -> torch.Tensor:
        """Logits of every node of the one row's tree, shape (1, n, V), float32; the root is the
        reference token at ``past_len``."""
        (tree,) = trees
        if self.past_len >= self.reference.shape[0] or tree.tokens[0] != self.reference[self.past_len]:
            raise ValueError("the tree's root is not the reference token after the cache")
        end = self.reference.shape[0]
        positions = self.past_len + tree.depths  # of each node's token in the sequence
        on_path = np.ones(tree.size, dtype=bool)  # parents come before children
        for node in range(1, tree.size):
            position = int(positions[node])
            matches = position < end and tree.tokens[node] == self.reference[position]
            on_path[node] = on_path[tree.parents[node]] and matches
        targets = np.array([self._next(int(p) + 1) if on else self.miss for p, on in zip(positions, on_path)])
        self.sizes.append(tree.size)
        return self._one_hot(targets)[None]

    def keep(self, nodes: list[np.ndarray]) -> None:
        """The one row's accepted nodes (shape (m,), root first) join the "cache"."""
        self.past_len += int(nodes[0].shape[0])

    def _next(self, position: int) -> int:
        """The reference token at ``position``, or ``miss`` past its end."""
        return int(self.reference[position]) if position < self.reference.shape[0] else self.miss

    def _one_hot(self, targets: np.ndarray) -> torch.Tensor:
        logits = torch.zeros(targets.shape[0], self.vocab_size)
        logits[torch.arange(targets.shape[0]), torch.from_numpy(targets)] = 1.0
        return logits


class CeilingDrafter(Drafter):
    """The clairvoyant bound among ``drafters``' candidates: proposes, of all their drafts,
    only the longest prefix of the reference continuation that any one of them starts with.

    Args:
        drafters: the drafters whose candidates are searched (their lifecycle calls are passed on).
        reference: shape (N,), int64, prompt followed by the saved greedy output.
    """

    name = "ceiling"
    prior_scale = 1.0

    def __init__(self, drafters: list[Drafter], reference: np.ndarray) -> None:
        self.drafters = [drafter.for_row(0) for drafter in drafters]  # a replay decodes one row
        self.reference = np.asarray(reference, dtype=np.int64).reshape(-1)

    def begin(self, prompt: np.ndarray) -> None:
        for drafter in self.drafters:
            drafter.begin(prompt)

    def propose(self, context: np.ndarray, max_len: int) -> list[Draft]:
        truth = self.reference[context.shape[0] : context.shape[0] + max_len]
        best = 0
        for drafter in self.drafters:
            for draft in drafter.propose(context, max_len):
                n = min(len(draft), truth.shape[0])
                wrong = np.flatnonzero(draft.tokens[:n] != truth[:n])
                best = max(best, int(wrong[0]) if wrong.size else n)
        return [Draft(truth[:best], np.ones(best))] if best else []

    def accept(self, new_tokens: np.ndarray) -> None:
        for drafter in self.drafters:
            drafter.accept(new_tokens)

    def end(self, output: np.ndarray) -> None:
        for drafter in self.drafters:
            drafter.end(output)


class UnobservedCost(ObservedCost):
    """Ignores observed forward times: the stand-in's take none, the cost curve models them."""

    def observe(self, cost: VerifyCost, size: int, seconds: float, cache_len: int = 0, rows: int = 1) -> None:
        return None


@dataclass(frozen=True)
class ReplayResult:
    """One replayed output: the engine's tokens (shape (m,)), its statistics, the modelled seconds."""

    output: np.ndarray
    stats: DecodeStats
    decode_s: float
    plain_s: float

    @property
    def tokens_per_step(self) -> float:
        """Tokens emitted per tree step, bonus included (plain decoding: 1.0)."""
        return self.stats.mean_accepted if self.stats.steps else 1.0

    @property
    def speedup(self) -> float:
        """Modelled plain-decoding time over modelled speculative time, both after the prefill."""
        return self.plain_s / self.decode_s if self.decode_s else 1.0


def replay(
    ref: dict,
    drafters: list[Drafter],
    cost: VerifyCost = DEFAULT_CURVE,
    max_draft_len: int = DEFAULTS.max_draft_len,
    tree_budget: int = DEFAULTS.tree_budget,
    ceiling: bool = False,
) -> ReplayResult:
    """Decode ``ref`` ({"prompt": ids, "out": ids}) with ``drafters`` through ``speculative_decode``.

    The planner is cost-aware with ``cost`` (with ``ceiling``: fixed-size over
    one ``CeilingDrafter`` wrapping ``drafters``). ``decode_s`` sums
    ``cost.seconds[tree size] + STEP_OVERHEAD_S`` over the steps; ``plain_s``
    is one single-token forward per token after the first (which the prefill gives).
    """
    prompt, out = np.asarray(ref["prompt"], np.int64), np.asarray(ref["out"], np.int64)
    if out.shape[0] == 0:
        return ReplayResult(out, DecodeStats(), 0.0, 0.0)
    reference = np.concatenate([prompt, out])
    model = ReplayModel(reference)
    if ceiling:
        drafters, planner = [CeilingDrafter(drafters, reference)], TreePlanner(tree_budget)
    else:
        planner = TreePlanner(tree_budget, cost, observed=UnobservedCost())
    options = DecodeOptions(max_new_tokens=int(out.shape[0]), max_draft_len=max_draft_len)
    (output,), stats = speculative_decode(model, torch.from_numpy(prompt)[None], [drafters], options, planner=planner)
    decode_s = float(sum(cost.seconds[size] for size in model.sizes)) + STEP_OVERHEAD_S * len(model.sizes)
    plain_s = max(int(output.shape[0]) - 1, 0) * float(cost.seconds[1])
    return ReplayResult(output, stats, decode_s, plain_s)


def drafter_menu(args: argparse.Namespace, store) -> list[Drafter]:
    """Fresh drafters for one output: ``--drafters`` names, else the plugin's default menu."""
    history = None
    if args.history:
        from retrieval_draft.drafters.history import HistoryDrafter

        history = HistoryDrafter.load(args.history)  # reloaded per output: none learns from another
    sources = DraftSources(store=store, history=history)
    names = args.drafters.split(",") if args.drafters else default_names(sources)
    return make_drafters([name.strip() for name in names if name.strip()], sources)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refs", type=Path, required=True,
                        help="greedy outputs: {id: {prompt, out}} (tools.diagnostics.fit_priors --refs)")
    parser.add_argument("--datastore", help="a datastore for the ngram and suffix drafters")
    parser.add_argument("--history", help="a saved output history (HistoryDrafter.load) for the history drafter")
    parser.add_argument("--drafters", help=f"comma list of {', '.join(DRAFTERS)} (default: the plugin's menu)")
    parser.add_argument("--max-draft-len", type=int, default=DEFAULTS.max_draft_len)
    parser.add_argument("--tree-budget", type=int, default=DEFAULTS.tree_budget)
    parser.add_argument("--ceiling", action="store_true", help="clairvoyant selection among the same candidates")
    parser.add_argument("--measure", action="store_true", help="measure the cost curve of the default model first")
    args = parser.parse_args(argv)
    refs = json.loads(args.refs.read_text())
    store = None
    if args.datastore:
        from retrieval_draft.store.opening import open_datastore

        store = open_datastore(args.datastore)
    cost = DEFAULT_CURVE
    if args.measure:
        from retrieval_draft.planning.cost_probe import measure_cost
        from retrieval_draft.model.models import load_model

        cost = measure_cost(load_model(None))
    try:
        drafter_menu(args, store)
    except InvalidInputError as error:
        parser.error(str(error))
    by_workload = defaultdict(list)
    for key, ref in refs.items():
        if not ref["out"]:
            continue
        result = replay(ref, drafter_menu(args, store), cost, args.max_draft_len, args.tree_budget, args.ceiling)
        if not np.array_equal(result.output, ref["out"]):
            raise SystemExit(f"{key}: the replay diverged from the saved output")
        by_workload[key.split("/")[0]].append((result.tokens_per_step, result.speedup))
    print("| workload | outputs | tokens per step | estimated speedup (geomean) |")
    print("|---|---:|---:|---:|")
    for workload, rows in by_workload.items():
        rows = np.array(rows)
        print(f"| {workload} | {rows.shape[0]} | {rows[:, 0].mean():.2f} | {np.exp(np.log(rows[:, 1]).mean()):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
