"""Choosing each step's token trees for B rows (one row: B = 1): calibrate, merge, size by cost.

``TreePlanner`` joins the two halves of planning: ``DraftGrader`` (what drafts are worth: each
drafter's guesses mapped to observed acceptance rates, graded every step) and ``TreeSizer`` (what
trees cost: the forward-cost curve, its corrections and the width that pays best). ``plan`` merges
each row's drafts into one candidate tree under the row's pending token, calibrated and with
siblings capped, and returns a ``StepPlan``: the pruned trees and what the step's outcome is
learned against (the full candidate trees, the probe forward it runs, its matmul path). Decoding
hands that record back to ``observe_forward`` (the forward's time) and ``observe`` (the model's
tokens); nothing is carried from one call to the next in private fields.

Given a ``CostProbe`` instead of a curve (the first single-row call of a process with no stored
curve), the planner measures the curve from decoding's own forwards: while the probe wants a
forward of n tokens that the step's candidates can fill, the step verifies the n most probable
nodes (through the matmul path the probe names) and the forward's time is recorded; other steps
are sized by the curve from the sizes timed so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

from retrieval_draft.config import DEFAULTS
from retrieval_draft.draft import Proposals
from retrieval_draft.planning.calibration import AcceptanceCalibrator, RankCorrection
from retrieval_draft.planning.cost import ObservedCost, VerifyCost
from retrieval_draft.planning.cost_probe import CostProbe, Probe
from retrieval_draft.planning.drafter_gate import DrafterGate
from retrieval_draft.planning.grader import DraftGrader
from retrieval_draft.planning.sizer import TreeSizer
from retrieval_draft.tree import DraftTree, merge_flat


@dataclass(frozen=True)
class StepPlan:
    """One step's plan for B rows, and what its outcome is learned against.

    Attributes:
        trees: B pruned trees, row i's rooted at its pending token.
        candidates: with a cost curve, per row the full candidate tree and its draft nodes' indices
            by decreasing probability (shape (n - 1,)), for grading the ranks; else empty.
        probing: the probe forward this step runs (``CostProbe``), or None.
        matmul_sizes: forward sizes that take the skinny matmul this step (None: the model's own).
    """

    trees: list[DraftTree]
    candidates: list[tuple[DraftTree, np.ndarray]] = field(default_factory=list)
    probing: Probe | None = None
    matmul_sizes: frozenset | None = None


class TreePlanner:
    """Builds each step's trees (one per row) and learns from each step's outcome.

    Args:
        tree_budget: most draft nodes in a tree (root excluded).
        cost: forward time by tree size; None means always ``tree_budget``.
        overhead_decay: smoothing of the measured per-step drafting time.
        calibrators, gate, ranks: the grader's (``DraftGrader``), shared with whoever passes the same
            objects (the plugin keeps them per model).
        observed, probe: the sizer's (``TreeSizer``), shared likewise.
    """

    def __init__(
        self,
        tree_budget: int = DEFAULTS.tree_budget,
        cost: VerifyCost | None = None,
        overhead_decay: float = 0.9,
        calibrators: dict[str, AcceptanceCalibrator] | None = None,
        gate: DrafterGate | None = None,
        observed: ObservedCost | None = None,
        ranks: RankCorrection | None = None,
        probe: CostProbe | None = None,
    ) -> None:
        self.sizer = TreeSizer(tree_budget, cost, overhead_decay, observed, probe)
        self.grader = DraftGrader(calibrators, gate, ranks)

    @property
    def tree_budget(self) -> int:
        return self.sizer.tree_budget

    @property
    def cost(self) -> VerifyCost | None:
        return self.sizer.cost

    @property
    def probe(self) -> CostProbe | None:
        return self.sizer.probe

    @property
    def calibrators(self) -> dict[str, AcceptanceCalibrator]:
        return self.grader.calibrators

    def should_ask(self, name: str) -> bool:
        """Whether to query drafter ``name`` this step (always, without a cost curve)."""
        return self.sizer.cost is None or self.grader.gate.should_ask(name)

    def register(self, drafters) -> None:
        """Give each drafter not seen before a calibrator with that drafter's ``prior_scale``."""
        self.grader.register(drafters)

    def calibrator(self, source: str) -> AcceptanceCalibrator:
        return self.grader.calibrator(source)

    def candidates(self, root_token: int, proposals: Proposals) -> DraftTree:
        """Every drafted node under the pending token, with calibrated probabilities (unpruned)."""
        return cap_siblings(merge_flat(root_token, *self.grader.calibrated(proposals)))

    def width(self, ranked: list[np.ndarray], cache_len: int = 0) -> int:
        """Draft nodes per row for candidates ``ranked`` (``TreeSizer.width``)."""
        return self.sizer.width(ranked, cache_len)

    def plan(self, roots: list[int], proposals: list[Proposals], cache_len: int = 0) -> StepPlan:
        """Row i's tree rooted at its pending token ``roots[i]`` from ``proposals[i]``; every
        tree keeps ``width`` draft nodes or fewer. ``cache_len``: cached tokens the trees
        attend to (the longest row's)."""
        fulls = [self.candidates(root, row) for root, row in zip(roots, proposals)]
        orders = [np.argsort(-full.probs[1:], kind="stable") + 1 for full in fulls]  # ``DraftTree.top``'s order
        ranked = [full.probs[order[: self.tree_budget]] for full, order in zip(fulls, orders)]
        candidates = []
        if self.sizer.cost is not None:
            candidates = list(zip(fulls, orders))
            ranked = [probs * self.grader.ranks.factors(probs.shape[0]) for probs in ranked]
        probing = self.sizer.probe_forward(ranked)
        budget = probing.tokens - 1 if probing is not None else self.sizer.width(ranked, cache_len)
        return StepPlan([full.top(budget, full.probs) for full in fulls], candidates, probing, self.sizer.matmul_sizes(probing))

    def observe_forward(self, rows: int, tokens: int, seconds: float, cache_len: int = 0, plan: StepPlan | None = None) -> None:
        """A forward over ``rows`` rows' trees, ``tokens`` new tokens in all (rows x width), after
        ``cache_len`` cached tokens, took ``seconds``; ``plan``: the step's (a probe forward's time
        goes to the probe)."""
        self.sizer.observe_forward(rows, tokens, seconds, cache_len, plan.probing if plan is not None else None)

    def observe(self, proposals: list[Proposals], truths: list[np.ndarray], draft_seconds: float,
                plan: StepPlan | None = None) -> None:
        """Grade every row's drafts (``proposals[i]``, each drafter's seconds included) against
        what the model produced in that row (``truths[i]``, accepted + bonus, shape (t_i,));
        ``plan``'s candidate trees grade the ranks; the drafters asked feed the drafter gate.
        ``draft_seconds``: all rows' drafting time this step."""
        matched = [row.matched(truth) for row, truth in zip(proposals, truths)]
        if self.sizer.cost is not None and truths:
            if plan is not None and len(plan.candidates) == len(truths):
                for (full, order), truth in zip(plan.candidates, truths):
                    self.grader.grade_ranks(full, order, truth)
            token_seconds = self.sizer.plain_step_seconds(len(truths))
            for row, row_matched in zip(proposals, matched):
                if row.asked.any():
                    self.grader.gate.observe(row, row_matched, token_seconds=token_seconds)
        self.grader.observe(proposals, truths, matched)
        self.sizer.observe_drafting(draft_seconds)


def cap_siblings(tree: DraftTree) -> DraftTree:
    """Scale children so that, under each node, their conditional probabilities sum to at most 1.

    Only one child of a node can be the model's next token, however many
    drafters vouch for their own; path probabilities are rebuilt top-down.
    """
    if tree.size == 1:
        return tree
    return DraftTree(tree.tokens, tree.parents, tree.depths, _capped(tree.parents, tree.probs))


@numba.njit(cache=True, nogil=True)
def _capped(parents: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """(n,) path probabilities after each node's children's conditionals (``probs`` over the
    parent's) are scaled to sum to at most 1; nodes in topological order, root 0."""
    n = probs.shape[0]
    conditional = np.zeros(n, np.float64)
    totals = np.zeros(n, np.float64)
    for node in range(1, n):
        above = probs[parents[node]]
        conditional[node] = probs[node] / above if above > 0 else 0.0
        totals[parents[node]] += conditional[node]
    capped = np.ones(n, np.float64)
    for node in range(1, n):  # parents come before children
        capped[node] = conditional[node] / max(totals[parents[node]], 1.0) * capped[parents[node]]
    return capped
