"""Choosing each step's token trees for B rows (one row: B = 1): calibrate, merge, size by cost.

Each drafter's guesses are first mapped to observed acceptance rates (one
calibrator per drafter, graded every step against what the model produced),
so a noisy drafter's many branches cost little and a reliable one's long
chains are kept. All rows' trees go through one forward padded to a common
width W, which costs about one forward over ``B * W`` tokens; each row keeps
its ``W - 1`` most probable draft nodes, and the expected tokens of a step are
``B + sum over rows of those nodes' probabilities``. With a measured cost
curve the planner picks the W that maximises expected tokens per second, so
the node budget goes where drafts are good; when drafts do not pay, W is 1
(the lone root: plain decoding). Without a cost curve every row keeps up to
``tree_budget`` nodes.

Given a ``CostProbe`` instead of a curve (the first single-row call of a process with no
stored curve), the planner measures the curve from decoding's own forwards: while the probe
wants a forward of n tokens that the step's candidates can fill, the step verifies the n most
probable nodes (through the matmul path the probe names, ``matmul_sizes``) and the forward's
time is recorded; other steps are sized by the curve from the sizes timed so far.

The cost curve is measured up to 32 tokens (``cost_probe.PROBE_SIZES``); beyond that it is extended along
the slope of its last stretch (``extended_cost``). One ``ObservedCost`` (the model's,
kept by the plugin) corrects it with the forward times decoding sees, per band of rows
(forwards of several rows also read B caches) and of cache length (trees after a long
prompt cost more per node).
"""

from __future__ import annotations

import numba
import numpy as np

from retrieval_draft.config import DEFAULTS
from retrieval_draft.tree import DraftTree, merge_flat
from retrieval_draft.draft import Draft, laid_end_to_end, matched_prefixes
from retrieval_draft.planning.calibration import AcceptanceCalibrator, RankCorrection
from retrieval_draft.planning.cost import ObservedCost, VerifyCost
from retrieval_draft.planning.cost_probe import CostProbe, Probe
from retrieval_draft.planning.drafter_gate import DrafterGate

SourcedDrafts = list[tuple[str, Draft]]  # (drafter name, draft)


class TreePlanner:
    """Builds each step's trees (one per row) and learns from each step's outcome.

    Args:
        tree_budget: most draft nodes in a tree (root excluded).
        cost: forward time by tree size; None means always ``tree_budget``.
        overhead_decay: smoothing of the measured per-step drafting time.
        calibrators: drafter name -> calibrator, shared with whoever passes the
            same dict (the plugin keeps one per model, so each call starts from
            the rates earlier calls observed); None starts from the priors.
        gate: decides which drafters are asked each step (only with a cost
            curve, which prices an accepted token); default a fresh ``DrafterGate``.
        observed: corrections of ``cost`` from the forward times decoding sees (by rows and
            cache length), shared like ``calibrators`` (the plugin keeps one per model).
        ranks: what the merged trees' ranks delivered against their probabilities, which
            scales them when a tree is sized (``RankCorrection``), shared like ``calibrators``.
        probe: a cost measurement to complete from this planner's single-row steps (the curve
            then comes from it: ``cost`` is ignored); shared like ``calibrators``.
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
        if tree_budget < 0:
            raise ValueError("tree_budget must be >= 0")
        self.tree_budget = tree_budget
        self.probe = probe if probe is not None and not probe.complete else None
        self.cost = probe.curve() if probe is not None else cost
        self._probing: Probe | None = None  # the probe this step's forward runs, if any
        self.calibrators: dict[str, AcceptanceCalibrator] = calibrators if calibrators is not None else {}
        self.overhead_decay = overhead_decay
        self.overhead_s = 0.0
        self.gate = gate if gate is not None else DrafterGate()
        self.observed = observed if observed is not None else ObservedCost()
        self.ranks = ranks if ranks is not None else RankCorrection()
        # each row's full candidate tree of the step being verified, with its draft nodes by decreasing probability
        self._candidates: list[tuple[DraftTree, np.ndarray]] = []
        self._curves: dict[int, VerifyCost] = {}  # rows -> the cost curve extended to cover them

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
        return cap_siblings(merge_flat(root_token, *self.calibrated(drafts)))

    def calibrated(self, drafts: SourcedDrafts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every draft laid end to end, in order: tokens (m,), calibrated conditional
        probabilities (m,) and each draft's length (d,); one calibrator call per drafter."""
        tokens, raw, lengths = laid_end_to_end([draft for _, draft in drafts])
        if not tokens.size:
            return tokens, raw, lengths
        depths = _depths(lengths)
        owners, names = _owners(drafts, lengths)
        rates = np.empty_like(raw)
        for number, source in enumerate(names):  # one call per drafter, over all its drafts' tokens
            mine = owners == number
            rates[mine] = self.calibrator(source).rates(raw[mine], depths[mine])
        np.clip(rates, 1e-6, 1.0, out=rates)
        return tokens, rates, lengths

    def plan(self, roots: list[int], drafts: list[SourcedDrafts], cache_len: int = 0) -> list[DraftTree]:
        """Row i's tree rooted at its pending token ``roots[i]`` from ``drafts[i]``; every
        tree keeps ``width`` draft nodes or fewer. ``cache_len``: cached tokens the trees
        attend to (the longest row's)."""
        fulls = [self.candidates(root, row) for root, row in zip(roots, drafts)]
        orders = [np.argsort(-full.probs[1:], kind="stable") + 1 for full in fulls]  # ``DraftTree.top``'s order
        ranked = [full.probs[order[: self.tree_budget]] for full, order in zip(fulls, orders)]
        if self.cost is not None:
            self._candidates = list(zip(fulls, orders))
            ranked = [probs * self.ranks.factors(probs.shape[0]) for probs in ranked]
        self._probing = self._fitting_probe(self._open_probe_forward(), ranked)
        budget = self._probing.tokens - 1 if self._probing is not None else self.width(ranked, cache_len)
        return [full.top(budget, full.probs) for full in fulls]

    def _open_probe_forward(self) -> Probe | None:
        """The open probe's next forward (None without one). A forward larger than this planner's
        trees can ever be ends its probing first: it plans with the sizes timed so far, corrected by
        the forwards it times (the measurement stays open, not stored, for a call with a larger
        ``tree_budget``)."""
        if self.probe is None:
            return None
        wanted = self.probe.pending()
        if wanted is not None and wanted.tokens - 1 > self.tree_budget:
            self.probe = None
            return None
        return wanted

    @staticmethod
    def _fitting_probe(wanted: Probe | None, ranked: list[np.ndarray]) -> Probe | None:
        """The probe's next forward ``wanted``, when this step is one row whose candidates fill it."""
        if wanted is None or len(ranked) != 1:
            return None
        return wanted if wanted.tokens - 1 <= ranked[0].shape[0] else None

    def matmul_sizes(self) -> frozenset | None:
        """Forward sizes (rows x width) that take the skinny matmul this step
        (``TreeModel.skinny_sizes``); None leaves the model's own."""
        if self._probing is not None:
            return self._probing.matmul_sizes
        return self.cost.skinny_sizes if self.cost is not None else None

    def width(self, ranked: list[np.ndarray], cache_len: int = 0) -> int:
        """Draft nodes per row (W - 1) that maximise expected tokens per second after
        ``cache_len`` cached tokens, or a wider tree that tests the curve (``explored_width``).

        ``ranked[i]``: row i's candidate probabilities, decreasing (shape (m_i,), at most
        ``tree_budget``). Without a cost curve every row takes all it has.
        """
        most = max((r.shape[0] for r in ranked), default=0)
        if self.cost is None or most == 0:
            return most
        rows = len(ranked)
        gains = np.full(most + 1, float(rows))
        for probs in ranked:
            summed = np.concatenate([[0.0], np.cumsum(probs)])
            gains += summed[np.minimum(np.arange(most + 1), probs.shape[0])]
        cost = self.observed.apply(self._curve(rows), cache_len, rows)
        tokens = np.minimum(rows * np.arange(1, most + 2), cost.max_nodes)
        seconds = cost.seconds[tokens] + self.overhead_s
        best = int(np.argmax(gains / seconds))
        if self.probe is not None:  # the curve is still being measured: nothing to test yet
            return best
        return explored_width(gains, seconds, tokens, self.observed.verified(cache_len, rows), self.observed, best)

    def observe_forward(self, rows: int, tokens: int, seconds: float, cache_len: int = 0) -> None:
        """A forward over ``rows`` rows' trees, ``tokens`` new tokens in all (rows x width), after
        ``cache_len`` cached tokens, took ``seconds``. A probe's forward goes to the probe
        (the curve then grows); no other forward corrects the curve until the probe is done."""
        if self._probing is not None:
            probing, self._probing = self._probing, None
            if rows == 1 and tokens == probing.tokens:
                self.probe.record(probing, seconds)
                self.cost = self.probe.curve()
                self._curves = {}
                if self.probe.complete:
                    self.probe = None
        elif self.cost is not None and self.probe is None:
            self.observed.observe(self._curve(rows), tokens, seconds, cache_len, rows)

    def observe(
        self, drafts: list[SourcedDrafts], truths: list[np.ndarray], draft_seconds: float, asked: list[dict]
    ) -> None:
        """Grade every row's drafts against what the model produced in that row (``truths[i]``,
        accepted + bonus, shape (t_i,)); rates decay once per step, however many rows.
        ``asked[i]``: drafter name -> (its drafts, seconds it took) for row i, for the drafter
        gate. ``draft_seconds``: all rows' drafting time this step."""
        if self.cost is not None and truths:
            if len(self._candidates) == len(truths):
                for (full, order), truth in zip(self._candidates, truths):
                    self.grade_ranks(full, order, truth)
            self._candidates = []
            rows = len(truths)
            token_seconds = float(self.cost.seconds[min(rows, self.cost.max_nodes)]) / rows  # a row's share of a plain step
            for row_asked, truth in zip(asked, truths):
                if row_asked:
                    self.gate.observe(row_asked, truth, token_seconds=token_seconds)
        for calibrator in self.calibrators.values():
            calibrator.decay_counts()
        for row_drafts, truth in zip(drafts, truths):
            self.grade(row_drafts, truth)
        d = self.overhead_decay
        self.overhead_s = d * self.overhead_s + (1 - d) * draft_seconds

    def grade_ranks(self, full: DraftTree, order: np.ndarray, truth: np.ndarray) -> None:
        """Record in ``ranks`` which of the candidate tree ``full``'s draft nodes (``order``: their
        indices by decreasing probability, shape (n - 1,)) the model's tokens ``truth`` (accepted +
        bonus, shape (t,)) confirmed, by rank, pruned nodes included."""
        if full.size == 1:
            return
        decided, confirmed = _confirmed(full.tokens, full.parents, full.depths, truth.astype(np.int64, copy=False))
        keep = decided[order]
        ranks = np.arange(1, order.shape[0] + 1)[keep]
        self.ranks.record(ranks, full.probs[order[keep]], confirmed[order[keep]])

    def _curve(self, rows: int) -> VerifyCost:
        """The cost curve covering ``rows`` full trees (extended past its measured sizes)."""
        if rows not in self._curves:
            self._curves[rows] = extended_cost(self.cost, rows * (self.tree_budget + 1))
        return self._curves[rows]

    def grade(self, drafts: SourcedDrafts, truth: np.ndarray) -> None:
        """Grade every offered draft against ``truth`` (shape (t,)): a token is tested when the
        tokens before it in its draft equal ``truth``, right when it does too. A drafter's drafts
        that share a prefix grade it once (its first draft's probabilities): a tested token's
        prefix is ``truth``'s, so (drafter, depth, token) names it."""
        tokens, raw, lengths = laid_end_to_end([draft for _, draft in drafts])
        if not tokens.size:
            return
        limit = np.minimum(lengths, truth.shape[0])
        matched = matched_prefixes(tokens, lengths, truth)
        tested = np.where(matched < limit, matched + 1, limit)  # through the first wrong token
        depths = _depths(lengths)
        owners, names = _owners(drafts, lengths)
        live = depths < np.repeat(tested, lengths)
        # first entry of each (drafter, depth, token) among the tested ones
        key = (owners * (int(depths.max()) + 1) + depths) * (int(tokens.max()) + 1) + tokens
        _, first = np.unique(np.where(live, key, -1), return_index=True)
        first = first[live[first]]
        right = tokens[first] == truth[np.minimum(depths[first], truth.shape[0] - 1)]
        right &= depths[first] < truth.shape[0]
        for number, source in enumerate(names):
            hers = owners[first] == number
            if hers.any():
                mine = first[hers]
                self.calibrator(source).record(raw[mine], depths[mine], right[hers])


def _depths(lengths: np.ndarray) -> np.ndarray:
    """(m,) each entry's index within its draft, for drafts laid end to end (``lengths`` (d,))."""
    return np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _owners(drafts: SourcedDrafts, lengths: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Each entry of the drafts laid end to end (``lengths`` (d,)): the number of its drafter
    (m,), and the drafters' names in order of first appearance."""
    index: dict[str, int] = {}
    numbers = np.array([index.setdefault(source, len(index)) for source, _ in drafts], dtype=np.int64)
    return np.repeat(numbers, lengths), list(index)


@numba.njit(cache=True, nogil=True)
def _confirmed(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, truth: np.ndarray):
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


EXPLORE_GAIN = 1.25  # a tree is tried when, priced like the cheapest verified forward, it would pay this much more


def explored_width(
    gains: np.ndarray, seconds: np.ndarray, tokens: np.ndarray, verified: np.ndarray, observed: ObservedCost, best: int
) -> int:
    """``best``, or a tree whose size band no recent forward has verified, when that tree would pay
    ``EXPLORE_GAIN`` times more than ``best`` if it cost what the cheapest verified forward costs
    (a forward over more tokens never costs less; on a GPU a small tree costs about that).

    A curve that prices trees too dear (measured in a busy spell, or kept from another day) would
    otherwise never be corrected: the planner would never run the sizes it believes dear, so
    decoding would never time them. Priced optimistically, an unverified size band is tried once;
    its forward's time then corrects the curve there (``ObservedCost``); a band is verified again
    after ``ObservedCost.expire_forwards`` forwards. On a right curve this costs one step's
    difference per band and expiry.

    Args:
        gains: (W,) expected tokens of a step for 0..W-1 draft nodes per row.
        seconds: (W,) the corrected curve's price of each, drafting overhead included.
        tokens: (W,) new tokens in each forward (rows x width).
        verified: (len(ObservedCost.BANDS),) size bands observed recently at these rows and cache length.
        observed: the corrections (for the size bands).
        best: the width that ``seconds`` says pays best.
    """
    checked = verified[observed.size_bands(tokens)]
    if checked.all() or not checked.any():  # nothing to test, or nothing seen yet to price it by
        return best
    hopeful = np.where(checked, seconds, np.minimum(seconds, seconds[checked].min()))
    rates = gains / hopeful
    tried = int(np.argmax(np.where(checked, -np.inf, rates)))
    if rates[tried] > EXPLORE_GAIN * gains[best] / seconds[best]:
        return tried
    return best


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
