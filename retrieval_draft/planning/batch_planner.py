"""Sizing the token trees of a whole batch: one width for all rows, chosen by gain per second.

All rows' trees go through one forward, padded to a common width W, so the
forward costs about what one row's forward over ``rows * W`` tokens costs
(the CPU's matmuls see ``rows * W`` input rows either way). Each row keeps its
``W - 1`` most probable draft nodes; the expected tokens of a step are
``rows + sum over rows of those nodes' probabilities``. The planner picks the
W that maximises expected tokens per second, so the node budget goes where
drafts are good: with one grounded row and several open ones, W follows the
grounded row's gain against every row's cost. When drafts do not pay, W is
1: plain batched decoding, one token per row.

The single-row cost curve is measured up to 64 tokens; beyond that it is
extended along the slope of its last stretch. Batch forwards also read B
caches, so their times are corrected by their own ``ObservedCost`` (kept
apart from the model's single-row corrections).
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.tree import DraftTree
from retrieval_draft.planning.cost import ObservedCost, VerifyCost
from retrieval_draft.planning.planner import SourcedDrafts, TreePlanner


def extended_cost(cost: VerifyCost, max_tokens: int) -> VerifyCost:
    """``cost`` out to ``max_tokens`` new tokens, extrapolated along the slope of its last half."""
    known = cost.seconds
    top = cost.max_nodes
    if max_tokens <= top:
        return cost
    half = max(top // 2, 1)
    slope = max((known[top] - known[top - half]) / half, 0.0)
    extra = known[top] + slope * np.arange(1, max_tokens - top + 1)
    return VerifyCost(np.concatenate([known, extra]), cost.skinny_sizes, cost.steady)


class BatchPlanner:
    """One step's trees for a batch, and learning from every row's outcome.

    Args:
        planner: the single-row planner whose calibrators, drafter gate, cost
            curve and node budget (``max_nodes`` per row) are shared.
        rows: batch size at the start (the cost curve is extended to cover it).
    """

    def __init__(self, planner: TreePlanner, rows: int) -> None:
        self.planner = planner
        self.cost = extended_cost(planner.cost, rows * (planner.max_nodes + 1)) if planner.cost is not None else None
        self.observed = ObservedCost()

    @property
    def max_nodes(self) -> int:
        return self.planner.max_nodes

    def register(self, drafters) -> None:
        self.planner.register(drafters)

    def should_ask(self, name: str) -> bool:
        """Whether to query drafter ``name`` this step (for every row)."""
        return self.planner.should_ask(name)

    def plan(self, roots: list[int], drafts: list[SourcedDrafts]) -> list[DraftTree]:
        """Row i's tree rooted at ``roots[i]`` from ``drafts[i]``; all of one width W or less."""
        fulls = [self.planner.candidates(root, row) for root, row in zip(roots, drafts)]
        width = self.width([np.sort(full.probs[1:])[::-1][: self.max_nodes] for full in fulls])
        return [full.top(width, full.probs) for full in fulls]

    def width(self, ranked: list[np.ndarray]) -> int:
        """Draft nodes per row (W - 1) that maximise expected tokens per second.

        ``ranked[i]``: row i's candidate probabilities, decreasing (shape (m_i,)).
        Without a cost curve every row takes all it has, up to ``max_nodes``.
        """
        most = max((r.shape[0] for r in ranked), default=0)
        if self.cost is None or most == 0:
            return most
        rows = len(ranked)
        gains = np.full(most + 1, float(rows))
        for probs in ranked:
            summed = np.concatenate([[0.0], np.cumsum(probs)])
            gains += summed[np.minimum(np.arange(most + 1), probs.shape[0])]
        cost = self.observed.apply(self.cost)
        tokens = rows * np.arange(1, most + 2)
        seconds = cost.seconds[np.minimum(tokens, cost.max_nodes)] + self.planner.overhead_s
        return int(np.argmax(gains / seconds))

    def observe_forward(self, tokens: int, seconds: float) -> None:
        """A batch forward over ``tokens`` new tokens in all (rows x width) took ``seconds``."""
        if self.cost is not None:
            self.observed.observe(self.cost, tokens, seconds)

    def observe(
        self, drafts: list[SourcedDrafts], truths: list[np.ndarray], draft_seconds: float, asked: list[dict]
    ) -> None:
        """Grade every row's drafts against what the model produced in that row (``truths[i]``,
        shape (t_i,)); rates decay once per step, however many rows. ``asked[i]``: drafter name ->
        (its drafts, seconds) for row i, for the drafter gate. ``draft_seconds``: the whole
        batch's drafting time this step."""
        planner = self.planner
        if self.cost is not None and truths:
            rows = len(truths)
            token_seconds = float(self.cost.seconds[min(rows, self.cost.max_nodes)]) / rows  # one row's share of a plain step
            for row_asked, truth in zip(asked, truths):
                if row_asked:
                    planner.gate.observe(row_asked, truth, token_seconds=token_seconds)
        for calibrator in planner.calibrators.values():
            calibrator.decay_counts()
        for row_drafts, truth in zip(drafts, truths):
            planner.grade(row_drafts, truth)
        d = planner.overhead_decay
        planner.overhead_s = d * planner.overhead_s + (1 - d) * draft_seconds
