"""Choosing each step's token tree: merge the drafts, estimate, size by cost.

With a measured cost curve the planner keeps the nodes most likely to be
accepted and stops adding nodes where one more would lower the expected
accepted tokens per second; when drafts keep failing the estimates fall and
the tree shrinks to the lone root, which is plain decoding. Without a cost
curve it keeps a fixed number of nodes.
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.calibration import AcceptanceCalibrator
from retrieval_draft.cost import VerifyCost
from retrieval_draft.drafters.base import Draft
from retrieval_draft.tree import DraftTree, merge_drafts


class TreePlanner:
    """Builds one tree per step and learns from each verification.

    Args:
        max_nodes: most draft nodes in a tree (root excluded).
        cost: forward time by tree size; None means always ``max_nodes``.
        calibrator: maps drafters' guesses to observed acceptance rates.
        overhead_decay: smoothing of the measured per-step drafting time.
    """

    def __init__(
        self,
        max_nodes: int = 32,
        cost: VerifyCost | None = None,
        calibrator: AcceptanceCalibrator | None = None,
        overhead_decay: float = 0.9,
    ) -> None:
        if max_nodes < 0:
            raise ValueError("max_nodes must be >= 0")
        self.max_nodes = max_nodes
        self.cost = cost
        self.calibrator = calibrator if calibrator is not None else AcceptanceCalibrator()
        self.overhead_decay = overhead_decay
        self.overhead_s = 0.0

    def plan(self, root_token: int, drafts: list[Draft]) -> DraftTree:
        """The tree to verify this step, rooted at the pending token."""
        full = merge_drafts(root_token, drafts)
        if full.size == 1 or self.max_nodes == 0:
            return full.top(0, full.probs)
        scores = self.calibrator.path_probs(full)
        budget = self.max_nodes
        if self.cost is not None:
            ranked = np.sort(scores[1:])[::-1][: self.max_nodes]
            budget = self.cost.best_size(ranked, self.overhead_s)
        return full.top(budget, scores)

    def observe(self, tree: DraftTree, accepted: np.ndarray, draft_seconds: float) -> None:
        """Learn from one step: which nodes were accepted and how long drafting took."""
        if tree.size > 1:
            self.calibrator.observe(tree, accepted)
        d = self.overhead_decay
        self.overhead_s = d * self.overhead_s + (1 - d) * draft_seconds
