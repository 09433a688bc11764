"""Choosing each step's token tree: calibrate the drafts, merge them, size by cost.

Each drafter's guesses are first mapped to observed acceptance rates (one
calibrator per drafter, graded every step against what the model produced),
so a noisy drafter's many branches cost little and a reliable one's long
chains are kept. With a measured cost curve the planner keeps the nodes most
likely to be accepted and stops where one more node would lower the expected
accepted tokens per second; when drafts keep failing the tree shrinks to the
lone root, which is plain decoding. Without a cost curve it keeps a fixed
number of nodes.
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.config import DEFAULTS
from retrieval_draft.tree import DraftTree, merge_drafts
from retrieval_draft.draft import Draft
from retrieval_draft.planning.calibration import AcceptanceCalibrator
from retrieval_draft.planning.cost import ObservedCost, VerifyCost
from retrieval_draft.planning.drafter_gate import DrafterGate

SourcedDrafts = list[tuple[str, Draft]]  # (drafter name, draft)


class TreePlanner:
    """Builds one tree per step and learns from each step's outcome.

    Args:
        max_nodes: most draft nodes in a tree (root excluded).
        cost: forward time by tree size; None means always ``max_nodes``.
        overhead_decay: smoothing of the measured per-step drafting time.
        calibrators: drafter name -> calibrator, shared with whoever passes the
            same dict (the plugin keeps one per model, so each call starts from
            the rates earlier calls observed); None starts from the priors.
        gate: decides which drafters are asked each step (only with a cost
            curve, which prices an accepted token); default a fresh ``DrafterGate``.
        observed: corrections of ``cost`` from the forward times decoding sees,
            shared like ``calibrators`` (the plugin keeps one per model).
    """

    def __init__(
        self,
        max_nodes: int = DEFAULTS.tree_budget,
        cost: VerifyCost | None = None,
        overhead_decay: float = 0.9,
        calibrators: dict[str, AcceptanceCalibrator] | None = None,
        gate: DrafterGate | None = None,
        observed: ObservedCost | None = None,
    ) -> None:
        if max_nodes < 0:
            raise ValueError("max_nodes must be >= 0")
        self.max_nodes = max_nodes
        self.cost = cost
        self.calibrators: dict[str, AcceptanceCalibrator] = calibrators if calibrators is not None else {}
        self.overhead_decay = overhead_decay
        self.overhead_s = 0.0
        self.gate = gate if gate is not None else DrafterGate()
        self.observed = observed if observed is not None else ObservedCost()

    def should_ask(self, name: str) -> bool:
        """Whether to query drafter ``name`` this step (always, without a cost curve)."""
        return self.cost is None or self.gate.should_ask(name)

    def register(self, drafters) -> None:
        """Give each drafter not seen before a calibrator with that drafter's ``prior_scale``."""
        for drafter in drafters:
            if drafter.name not in self.calibrators:
                self.calibrators[drafter.name] = AcceptanceCalibrator(prior_scale=drafter.prior_scale)

    def calibrator(self, source: str) -> AcceptanceCalibrator:
        """The calibrator of one drafter (created with the default prior on first use)."""
        if source not in self.calibrators:
            self.calibrators[source] = AcceptanceCalibrator()
        return self.calibrators[source]

    def candidates(self, root_token: int, drafts: SourcedDrafts) -> DraftTree:
        """Every drafted node under the pending token, with calibrated probabilities (unpruned)."""
        calibrated = [
            Draft(d.tokens, np.clip(self.calibrator(source).rates(d.probs), 1e-6, 1.0))
            for source, d in drafts
            if len(d)
        ]
        return cap_siblings(merge_drafts(root_token, calibrated))

    def plan(self, root_token: int, drafts: SourcedDrafts) -> DraftTree:
        """The tree to verify this step, rooted at the pending token."""
        full = self.candidates(root_token, drafts)
        budget = min(self.max_nodes, full.size - 1)
        if self.cost is not None and budget > 0:
            ranked = np.sort(full.probs[1:])[::-1][:budget]
            budget = self.observed.apply(self.cost).best_size(ranked, self.overhead_s)
        return full.top(budget, full.probs)

    def observe_forward(self, size: int, seconds: float) -> None:
        """A tree forward over ``size`` new tokens (root included) took ``seconds``."""
        if self.cost is not None:
            self.observed.observe(self.cost, size, seconds)

    def observe(self, drafts: SourcedDrafts, truth: np.ndarray, draft_seconds: float, asked: dict | None = None) -> None:
        """Grade every offered draft against ``truth``, the tokens the model produced
        this step (accepted + bonus, shape (t,)); track drafting time. ``asked``:
        drafter name -> (its drafts, seconds it took), for the drafter gate."""
        if asked and self.cost is not None:
            self.gate.observe(asked, truth, token_seconds=float(self.cost.seconds[1]))
        for calibrator in self.calibrators.values():
            calibrator.decay_counts()
        self.grade(drafts, truth)
        d = self.overhead_decay
        self.overhead_s = d * self.overhead_s + (1 - d) * draft_seconds

    def grade(self, drafts: SourcedDrafts, truth: np.ndarray) -> None:
        """Grade every offered draft against ``truth`` (shape (t,)), each shared prefix once."""
        graded: set[tuple] = set()  # (source, prefix) pairs already graded this step
        for source, draft in drafts:
            tokens = draft.tokens.tolist()
            skip = 0
            while skip < len(tokens) and (source, *tokens[: skip + 1]) in graded:
                skip += 1
            graded.update((source, *tokens[: i + 1]) for i in range(skip, len(tokens)))
            self.calibrator(source).grade(draft.probs, draft.tokens, truth, skip)


def cap_siblings(tree: DraftTree) -> DraftTree:
    """Scale children so that, under each node, their conditional probabilities sum to at most 1.

    Only one child of a node can be the model's next token, however many
    drafters vouch for their own; path probabilities are rebuilt top-down.
    """
    if tree.size == 1:
        return tree
    parents = np.maximum(tree.parents, 0)
    conditional = np.divide(tree.probs, tree.probs[parents], out=np.zeros_like(tree.probs), where=tree.probs[parents] > 0)
    conditional[0] = 0.0
    totals = np.zeros(tree.size)
    np.add.at(totals, parents[1:], conditional[1:])
    conditional /= np.maximum(totals[parents], 1.0)
    probs = np.ones(tree.size)
    for depth in range(1, int(tree.depths.max()) + 1):
        level = tree.depths == depth
        probs[level] = conditional[level] * probs[parents[level]]
    return DraftTree(tree.tokens, tree.parents, tree.depths, probs)
