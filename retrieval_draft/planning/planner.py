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

The acceptance side lives here too. ``DraftGrader`` maps each drafter's guesses to observed
acceptance rates (one ``AcceptanceCalibrator`` per drafter, graded every step against what the
model produced, pruned drafts included), so a noisy drafter's many branches cost little and a
reliable one's long chains are kept; it records what the merged trees' ranks delivered against
what they promised (``RankCorrection``). ``DrafterGate`` asks only the drafters whose drafts pay
for their time: asking costs a drafter's ``propose`` time every step and pays back only the
tokens it gets right that no other drafter offered (its *marginal* tokens), each worth about one
plain step; a drafter whose expected saving falls below its cost is asked every 2nd, 4th, ... up
to every ``max_interval``-th step, and every step again as soon as a query shows it pays. A
drafter costing under ``free_share`` of a step is always asked. Outputs never depend on the
grader or the gate, only speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

from retrieval_draft.config import DEFAULTS
from retrieval_draft.draft import Proposals, owner_runs
from retrieval_draft.planning.calibration import AcceptanceCalibrator, RankCorrection
from retrieval_draft.planning.cost import ObservedCost, VerifyCost
from retrieval_draft.planning.cost_probe import CostProbe, Probe
from retrieval_draft.planning.sizer import TreeSizer
from retrieval_draft.tree import DraftTree, lone_root, merge_flat


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

    @property
    def row_by_row(self) -> bool:
        """The skinny matmul's loop on this machine (``TreeSizer.row_by_row``), for ``TreeModel.row_by_row``."""
        return self.sizer.row_by_row

    def should_ask(self, name: str) -> bool:
        """Whether to query drafter ``name`` this step (always, without a cost curve)."""
        return self.sizer.cost is None or self.grader.gate.should_ask(name)

    def begin(self) -> None:
        """A generation starts: every drafter is asked at its first step (``DrafterGate.restart``)."""
        self.grader.gate.restart()

    def register(self, drafters) -> None:
        """Give each drafter not seen before a calibrator with that drafter's ``prior_scale``."""
        self.grader.register(drafters)

    def calibrator(self, source: str) -> AcceptanceCalibrator:
        return self.grader.calibrator(source)

    def candidates(self, root_token: int, proposals: Proposals) -> DraftTree:
        """Every drafted node under the pending token, with calibrated probabilities (unpruned)."""
        if not proposals.used:  # nothing drafted (most rows of a fresh batch): no calibrating or capping
            return lone_root(root_token)
        return cap_siblings(merge_flat(root_token, *self.grader.calibrated(proposals)))

    def width(self, ranked: list[np.ndarray], cache_len: int = 0) -> int:
        """Draft nodes per row for candidates ``ranked`` (``TreeSizer.width``)."""
        return self.sizer.width(ranked, cache_len)

    def plan(self, roots: list[int], proposals: list[Proposals], cache_len: int = 0) -> StepPlan:
        """Row i's tree rooted at its pending token ``roots[i]`` from ``proposals[i]``; every
        tree keeps ``width`` draft nodes or fewer. ``cache_len``: cached tokens the trees
        attend to (the longest row's)."""
        fulls = [self.candidates(root, row) for root, row in zip(roots, proposals)]
        orders = [full.ranked() for full in fulls]  # ``DraftTree.top``'s order
        ranked = [full.probs[order[: self.tree_budget]] for full, order in zip(fulls, orders)]
        candidates = []
        if self.sizer.cost is not None:
            candidates = list(zip(fulls, orders))
            most = max(probs.shape[0] for probs in ranked)
            if most:
                factors = self.grader.ranks.factors(most)
                ranked = [probs * factors[: probs.shape[0]] for probs in ranked]
        probing = self.sizer.probe_forward(ranked)
        budget = probing.tokens - 1 if probing is not None else self.sizer.width(ranked, cache_len)
        trees = [full if budget + 1 >= full.size else full.kept(order[:budget]) for full, order in zip(fulls, orders)]
        return StepPlan(trees, candidates, probing, self.sizer.matmul_sizes(probing))

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
                if row.anyone_asked():
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
    return DraftTree.built(tree.tokens, tree.parents, tree.depths, _capped(tree.parents, tree.probs))


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


class DraftGrader:
    """Calibrated probabilities for a step's drafts, and learning from the step's outcome.

    Args:
        calibrators: drafter name -> calibrator, shared with whoever passes the same dict (the
            plugin keeps one per model, so each call starts from the rates earlier calls
            observed); None starts from the priors.
        gate: decides which drafters are asked each step (used only with a cost curve, which
            prices an accepted token); default a fresh ``DrafterGate``.
        ranks: what the merged trees' ranks delivered against their probabilities (shared like
            ``calibrators``).
    """

    def __init__(
        self, calibrators: dict[str, AcceptanceCalibrator] | None = None, gate: DrafterGate | None = None,
        ranks: RankCorrection | None = None,
    ) -> None:
        self.calibrators: dict[str, AcceptanceCalibrator] = calibrators if calibrators is not None else {}
        self.gate = gate if gate is not None else DrafterGate()
        self.ranks = ranks if ranks is not None else RankCorrection()

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

    def calibrated(self, proposals: Proposals) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The row's drafts laid end to end, in order (views of the buffer where nothing
        changes): tokens (m,), calibrated conditional probabilities (m,) and each draft's length
        (d,); one calibrator call per drafter."""
        tokens, raw, lengths = proposals.flat()
        if not tokens.size:
            return tokens, raw, lengths
        depths = proposals.depths[: proposals.used]
        rates = np.empty_like(raw)
        for owner, start, end in proposals.runs():  # one calibrator call per run of one drafter's drafts
            rates[start:end] = self.calibrator(proposals.names[owner]).rates(raw[start:end], depths[start:end])
        np.clip(rates, 1e-6, 1.0, out=rates)
        return tokens, rates, lengths

    def observe(self, proposals: list[Proposals], truths: list[np.ndarray], matched: list[np.ndarray]) -> None:
        """Grade every row's drafts against what the model produced in that row (``truths[i]``,
        accepted + bonus, shape (t_i,); ``matched[i]``: ``matched_prefixes`` of the row's drafts
        against it); rates decay once per step, however many rows."""
        for calibrator in self.calibrators.values():
            calibrator.decay_counts()
        for row, truth, row_matched in zip(proposals, truths, matched):
            self.grade(row, truth, row_matched)

    def grade(self, proposals: Proposals, truth: np.ndarray, matched: np.ndarray | None = None) -> None:
        """Grade every offered draft against ``truth`` (shape (t,) int64; ``matched``:
        ``proposals.matched(truth)`` where the caller has it): a token is tested when the tokens before it in
        its draft equal ``truth``, right when it does too. A drafter's drafts that share a prefix
        grade it once (its first draft's probabilities): a tested token's prefix is ``truth``'s,
        so (drafter, depth, token) names it."""
        tokens, raw, lengths = proposals.flat()
        if not tokens.size:
            return
        if matched is None:
            matched = proposals.matched(truth)
        depths, owners = proposals.depths[: proposals.used], proposals.entry_owners[: proposals.used]
        first, right = first_tested(tokens, depths, owners, lengths, matched, truth)
        for owner, start, end in owner_runs(owners[first]):  # ``first`` is ordered by owner
            mine = first[start:end]
            self.calibrator(proposals.names[owner]).record(raw[mine], depths[mine], right[start:end])

    def grade_ranks(self, full: DraftTree, order: np.ndarray, truth: np.ndarray) -> None:
        """Record in ``ranks`` which of the candidate tree ``full``'s draft nodes (``order``: their
        indices by decreasing probability, shape (n - 1,)) the model's tokens ``truth`` (accepted +
        bonus, shape (t,)) confirmed, by rank, pruned nodes included."""
        if full.size == 1:
            return
        decided, confirmed = confirmed_nodes(full.tokens, full.parents, full.depths, truth.astype(np.int64, copy=False))
        keep = decided[order]
        ranks = np.arange(1, order.shape[0] + 1)[keep]
        self.ranks.record(ranks, full.probs[order[keep]], confirmed[order[keep]])


@numba.njit(cache=True, nogil=True)
def first_tested(tokens, depths, owners, lengths, matched, truth):  # pragma: no cover - compiled
    """The entries that grade their drafters, and whether each was right.

    Of drafts laid end to end (``tokens``, ``depths``, ``owners`` (m,); ``lengths``, ``matched``
    (d,): how many leading tokens of each equal ``truth`` (t,)), an entry is tested when the
    entries before it in its draft were right (through the first wrong one); of tested entries
    with equal (owner, depth, token) only the first counts. Returns their indices (k,) int64,
    ordered by owner then position, and whether each equals ``truth`` at its depth (k,) bool.
    """
    m = tokens.shape[0]
    chosen = np.zeros(m, np.bool_)
    start = 0
    for d in range(lengths.shape[0]):
        limit = min(lengths[d], truth.shape[0])
        tested = matched[d] + 1 if matched[d] < limit else limit
        for j in range(start, start + tested):
            duplicate = False
            for i in range(j):  # tested entries are few: a pairwise check beats a hash
                if chosen[i] and owners[i] == owners[j] and depths[i] == depths[j] and tokens[i] == tokens[j]:
                    duplicate = True
                    break
            chosen[j] = not duplicate
        start += lengths[d]
    # The chosen entries by owner, by position within one: a stable insertion (they are few, and Numba
    # compiles it in a fifth of the time a stable argsort takes).
    first = np.empty(m, np.int64)
    count = 0
    for j in range(m):
        if chosen[j]:
            i = count
            while i > 0 and owners[first[i - 1]] > owners[j]:
                first[i] = first[i - 1]
                i -= 1
            first[i] = j
            count += 1
    first = first[:count]
    right = np.empty(count, np.bool_)
    for k in range(count):
        depth = depths[first[k]]
        right[k] = depth < truth.shape[0] and tokens[first[k]] == truth[depth]
    return first, right


@numba.njit(cache=True, nogil=True)
def confirmed_nodes(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, truth: np.ndarray):
    """Of a tree's nodes (n,), topological, root 0: which the model's tokens ``truth`` (t,) decide
    (a node below a refuted one is refuted; one below the bonus token, at depth > t, is not
    decided) and which they confirm (its path equals ``truth``'s first tokens); each (n,) bool."""
    n = tokens.shape[0]
    decided = np.zeros(n, np.bool_)
    confirmed = np.zeros(n, np.bool_)
    decided[0] = True
    confirmed[0] = True
    for node in range(1, n):
        parent = parents[node]
        if not decided[parent]:
            continue
        if not confirmed[parent]:
            decided[node] = True
        elif depths[node] <= truth.shape[0]:
            decided[node] = True
            confirmed[node] = tokens[node] == truth[depths[node] - 1]
    return decided, confirmed


@dataclass
class DrafterRecord:
    """Observations of one drafter: its seconds per query (the median of its last ``COST_WINDOW``
    queries: a first use's one-off costs, a Numba kernel loading, say, are outliers, not what each
    query costs) and its marginal tokens per query (smoothed)."""

    marginal: float = 0.0
    queries: int = 0
    interval: int = 1  # ask every ``interval``-th step
    wait: int = 0  # steps left before the next query
    recent: list[float] = field(default_factory=list)  # seconds of the last queries, oldest first

    COST_WINDOW = 5

    def cost(self, seconds: float) -> None:
        """One more query took ``seconds`` (only the last ``COST_WINDOW`` are kept)."""
        self.recent = self.recent[1 - self.COST_WINDOW :] + [seconds]

    @property
    def seconds(self) -> float:
        """What a query costs: the median of the last ``COST_WINDOW`` (0.0 before any)."""
        if not self.recent:
            return 0.0
        ordered = sorted(self.recent)  # at most 5: sorting beats numpy's median call by ~10x
        middle = len(ordered) // 2
        return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


class DrafterGate:
    """Skips drafters that cost more than they add.

    Args:
        decay: weight of the old average of marginal tokens in each update (0.9: about the last
            ten queries); a drafter's seconds are the median of its last queries (``DrafterRecord``).
        min_queries: queries observed before a drafter may be skipped.
        max_interval: longest gap, in steps, between two queries of a drafter that does not pay.
        free_share: a drafter whose query costs less than this fraction of
            ``token_seconds`` is never skipped.
    """

    def __init__(
        self, decay: float = 0.9, min_queries: int = 8, max_interval: int = 32, free_share: float = 0.01
    ) -> None:
        if not 0.0 <= decay < 1.0 or min_queries < 1 or max_interval < 1 or free_share < 0:
            raise ValueError("decay must lie in [0, 1), min_queries and max_interval >= 1, free_share >= 0")
        self.decay = decay
        self.min_queries = min_queries
        self.max_interval = max_interval
        self.free_share = free_share
        self.records: dict[str, DrafterRecord] = {}

    def restart(self) -> None:
        """A new call: ask every drafter at its next step, and back off from there (every 2nd, 4th, ...
        step) for one that does not pay. What was learned of each drafter's cost and worth is kept,
        so a drafter seen not to pay is skipped from its first unpaid query, not after
        ``min_queries``; but no call starts inside a wait run up by earlier calls' prompts: a drafter
        useless there (the output history on new prompts) may draft this one whole."""
        for record in self.records.values():
            record.wait = 0
            record.interval = 1

    def should_ask(self, name: str) -> bool:
        """Whether to query drafter ``name`` this step (counts the step down when not)."""
        record = self.records.get(name)
        if record is None:
            record = self.records[name] = DrafterRecord()
        if record.wait > 0:
            record.wait -= 1
            return False
        return True

    def observe(self, proposals: Proposals, matched: np.ndarray, token_seconds: float) -> None:
        """Update the drafters asked this step (``proposals.asked``) and reschedule them.

        Args:
            proposals: the row's drafts this step, with each drafter's ``propose`` seconds.
            matched: shape (d,), how many leading tokens of each draft equal the tokens the
                model produced (``matched_prefixes``): a drafter got right the longest of its own.
            token_seconds: what one more accepted token saves (about one plain step).
        """
        right = [0] * len(proposals.names)
        for owner, length in zip(proposals.owners[: proposals.count].tolist(), matched.tolist()):
            right[owner] = max(right[owner], length)
        spent = proposals.seconds.tolist()
        for number, asked in enumerate(proposals.asked.tolist()):  # a few drafters: lists, not numpy calls
            if not asked:
                continue
            name, seconds = proposals.names[number], spent[number]
            others = max(right[:number] + right[number + 1 :], default=0)
            record = self.records.get(name)
            if record is None:
                record = self.records[name] = DrafterRecord()
            d = 0.0 if record.queries == 0 else self.decay
            record.cost(seconds)
            record.marginal = d * record.marginal + (1 - d) * max(right[number] - others, 0)
            record.queries += 1
            cost = record.seconds
            pays = record.marginal * token_seconds >= cost or cost < self.free_share * token_seconds
            if pays or record.queries < self.min_queries:
                record.interval = 1
            else:
                record.interval = min(record.interval * 2, self.max_interval)
            record.wait = record.interval - 1
