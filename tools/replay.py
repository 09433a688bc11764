"""Replay greedy outputs through the drafters and the tree planner, without running the model.

Under greedy decoding the tokens the model will emit are known in advance
(``tools/fit_priors.py --refs`` saves them), so a decode can be replayed
step by step: drafters propose, the planner builds its tree, the tree is
walked against the known tokens, and the planner learns as it would live.
Time is modelled with a forward-cost curve (measured with ``--measure`` or
the default below, measured on the 2-core CPU of shared/DESIGN.md), so the
"speedup" here is an estimate for tuning, not a benchmark: timed claims
come from ``tools/bench.py``. ``--ceiling`` also reports the clairvoyant
bound: each step verifies just the accepted part of the best candidate.

    python tools/replay.py --refs refs.json [--datastore DIR] [--history FILE] [--ceiling]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from retrieval_draft.cost import VerifyCost
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.planner import TreePlanner
from retrieval_draft.tree import DraftTree

# ms per forward over k new tokens after a 256-token cache, SmolLM2-135M, 2 cores, torch 2.13,
# with the in-place KV cache, grouped tree attention and the skinny matmul for 4-15 nodes
# (``retrieval_draft.cost.measure_cost``, 5 repeats, 2026-11-22).
DEFAULT_CURVE = VerifyCost.from_points(
    (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64),
    np.array((31.6, 32.4, 34.7, 42.4, 46.5, 52.0, 60.2, 68.1, 77.8, 84.5, 99.4, 123.9)) / 1000,
)
STEP_OVERHEAD_S = 0.0012  # drafting and bookkeeping per step, measured by the bench's drafting share


def accepted_length(tree: DraftTree, truth: np.ndarray) -> int:
    """Draft tokens greedy verification accepts: follow the child equal to the next true token."""
    children = tree.children()
    node, accepted = 0, 0
    while accepted < truth.shape[0]:
        match = [c for c in children[node] if tree.tokens[c] == truth[accepted]]
        if not match:
            break
        node, accepted = match[0], accepted + 1
    return accepted


def best_candidate(drafts, truth: np.ndarray) -> int:
    """Longest prefix of ``truth`` that any single draft starts with."""
    best = 0
    for _, draft in drafts:
        n = min(len(draft), truth.shape[0])
        wrong = np.flatnonzero(draft.tokens[:n] != truth[:n])
        best = max(best, int(wrong[0]) if wrong.size else n)
    return best


def replay(ref: dict, make_drafters, cost: VerifyCost, max_draft_len: int, tree_budget: int, ceiling: bool):
    """(tokens per step, estimated speedup over one token per forward) for one reference output."""
    prompt, out = np.asarray(ref["prompt"], np.int64), np.asarray(ref["out"], np.int64)
    drafters, planner = make_drafters(), TreePlanner(tree_budget, cost)
    planner.register(drafters)
    for drafter in drafters:
        drafter.begin(prompt)
    pos = steps = 0
    seconds = 0.0
    while pos < out.shape[0]:
        context, truth = np.concatenate([prompt, out[:pos]]), out[pos:]
        max_len = min(max_draft_len, truth.shape[0] - 1)
        drafts = [(d.name, x) for d in drafters for x in d.propose(context, max_len)] if max_len > 0 else []
        if ceiling:
            accepted = best_candidate(drafts, truth)
            nodes = accepted + 1
        else:
            tree = planner.plan(int(context[-1]), drafts)
            accepted, nodes = accepted_length(tree, truth), tree.size
        emitted = truth[: min(accepted + 1, truth.shape[0])]
        planner.observe(drafts, emitted, STEP_OVERHEAD_S)
        for drafter in drafters:
            drafter.accept(emitted)
        seconds += cost.seconds[nodes] + STEP_OVERHEAD_S
        pos, steps = pos + emitted.shape[0], steps + 1
    return out.shape[0] / steps, out.shape[0] * cost.seconds[1] / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refs", type=Path, required=True, help="greedy outputs: {id: {prompt, out}} (fit_priors.py --refs)")
    parser.add_argument("--datastore", help="add the datastore's n-gram and suffix drafters")
    parser.add_argument("--history", help="add a saved output history (HistoryDrafter.load)")
    parser.add_argument("--max-draft-len", type=int, default=32)
    parser.add_argument("--tree-budget", type=int, default=32)
    parser.add_argument("--ceiling", action="store_true", help="clairvoyant selection among the same candidates")
    parser.add_argument("--measure", action="store_true", help="measure the cost curve of the default model first")
    args = parser.parse_args(argv)
    refs = json.loads(args.refs.read_text())
    store = []
    if args.datastore:
        from datastore.store import open_datastore
        from retrieval_draft.drafters.ngram import NgramDrafter
        from retrieval_draft.drafters.suffix import SuffixDrafter

        opened = open_datastore(args.datastore)
        store = [NgramDrafter(opened), SuffixDrafter(opened)]

    def make_drafters():
        chosen = [PromptLookupDrafter(), *store]
        if args.history:
            from retrieval_draft.drafters.history import HistoryDrafter

            chosen.append(HistoryDrafter.load(args.history))
        return chosen

    cost = DEFAULT_CURVE
    if args.measure:
        from retrieval_draft.cost import measure_cost
        from retrieval_draft.models import load_model

        cost = measure_cost(load_model(None))
    by_workload = defaultdict(list)
    for key, ref in refs.items():
        by_workload[key.split("/")[0]].append(replay(ref, make_drafters, cost, args.max_draft_len, args.tree_budget, args.ceiling))
    print("| workload | outputs | tokens per step | estimated speedup (geomean) |")
    print("|---|---:|---:|---:|")
    for workload, rows in by_workload.items():
        rows = np.array(rows)
        print(f"| {workload} | {rows.shape[0]} | {rows[:, 0].mean():.2f} | {np.exp(np.log(rows[:, 1]).mean()):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
