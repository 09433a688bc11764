"""How many draft nodes each row's tree keeps this step: the cost side of planning.

``TreeSizer`` owns the forward-cost curve (measured, or being measured by a ``CostProbe`` from
decoding's own forwards), the corrections decoding's forward times make to it (``ObservedCost``, by
rows and cache length) and the smoothed drafting time per step. Given each row's candidate
probabilities it picks the width (draft nodes per row) that maximises expected tokens per second,
or a tree that tests the curve where no recent forward verified it (``explored_width``). All rows'
trees go through one forward padded to a common width W, which costs about one forward over
``B * W`` tokens; the expected tokens of a step are ``B + sum over rows of their kept nodes'
probabilities``. Without a curve every row keeps up to ``tree_budget`` nodes.

The cost curve is measured up to 32 tokens (``cost_probe.PROBE_SIZES``); beyond that it is extended
along the slope of its last stretch (``extended_cost``).
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.config import DEFAULTS, check_setting
from retrieval_draft.planning.cost import ObservedCost, VerifyCost
from retrieval_draft.planning.cost_probe import CostProbe, Probe

EXPLORE_GAIN = 1.25  # a tree is tried when, priced like the cheapest verified forward, it would pay this much more


class TreeSizer:
    """The width of each step's trees, from the cost curve and what decoding's forwards cost.

    Args:
        tree_budget: most draft nodes in a tree (root excluded), checked by the config's rule
            (``config.check_setting``: an integer in 0..4096, else ``InvalidInputError``).
        cost: forward time by tree size; None means always ``tree_budget``.
        overhead_decay: smoothing of the measured per-step drafting time.
        observed: corrections of ``cost`` (shared: the plugin keeps one per model).
        probe: a cost measurement to complete from single-row steps (the curve then comes from
            it: ``cost`` is ignored); shared like ``observed``.
    """

    def __init__(
        self, tree_budget: int = DEFAULTS.tree_budget, cost: VerifyCost | None = None, overhead_decay: float = 0.9,
        observed: ObservedCost | None = None, probe: CostProbe | None = None,
    ) -> None:
        self.tree_budget = check_setting("tree_budget", tree_budget)
        self.probe = probe if probe is not None and not probe.complete else None
        self.cost = probe.curve() if probe is not None else cost
        self.overhead_decay = overhead_decay
        self.overhead_s = 0.0
        self.observed = observed if observed is not None else ObservedCost()
        self._curves: dict[int, VerifyCost] = {}  # rows -> the cost curve extended to cover them

    def probe_forward(self, ranked: list[np.ndarray]) -> Probe | None:
        """The probe's next forward when this step can run it: one row whose candidates (``ranked[0]``,
        shape (m,)) fill it. A forward larger than this sizer's trees can ever be ends its probing
        first: it plans with the sizes timed so far, corrected by the forwards it times (the
        measurement stays open, not stored, for a call with a larger ``tree_budget``)."""
        if self.probe is None:
            return None
        wanted = self.probe.pending()
        if wanted is not None and wanted.tokens - 1 > self.tree_budget:
            self.probe = None
            return None
        if wanted is None or len(ranked) != 1 or wanted.tokens - 1 > ranked[0].shape[0]:
            return None
        return wanted

    def matmul_sizes(self, probing: Probe | None) -> frozenset | None:
        """Forward sizes (rows x width) that take the skinny matmul this step (``TreeModel.skinny_sizes``);
        None leaves the model's own. ``probing``: the probe forward this step runs, if any."""
        if probing is not None:
            return probing.matmul_sizes
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
        # a row's expected tokens at each width: its bonus token plus its nodes' sum (a short row's
        # sum stays flat past its last node, the zeros it is padded with)
        padded = np.zeros((rows, most))
        for row, probs in enumerate(ranked):
            padded[row, : probs.shape[0]] = probs
        gains = np.full(most + 1, float(rows))
        gains[1:] += np.cumsum(padded.sum(axis=0))
        cost = self.observed.apply(self._curve(rows), cache_len, rows)
        tokens = np.minimum(rows * np.arange(1, most + 2), cost.max_nodes)
        seconds = cost.seconds[tokens] + self.overhead_s
        best = int(np.argmax(gains / seconds))
        if self.probe is not None:  # the curve is still being measured: nothing to test yet
            return best
        return explored_width(gains, seconds, tokens, self.observed.verified(cache_len, rows), self.observed, best)

    def observe_forward(self, rows: int, tokens: int, seconds: float, cache_len: int = 0, probing: Probe | None = None) -> None:
        """A forward over ``rows`` rows' trees, ``tokens`` new tokens in all (rows x width), after
        ``cache_len`` cached tokens, took ``seconds``. ``probing``: the probe forward the step ran (its
        plan's), whose time goes to the probe (the curve then grows); no other forward corrects the
        curve until the probe is done."""
        if probing is not None:
            if self.probe is not None and rows == 1 and tokens == probing.tokens:
                self.probe.record(probing, seconds)
                self.cost = self.probe.curve()
                self._curves = {}
                if self.probe.complete:
                    self.probe = None
        elif self.cost is not None and self.probe is None:
            self.observed.observe(self._curve(rows), tokens, seconds, cache_len, rows)

    def observe_drafting(self, seconds: float) -> None:
        """This step's drafting took ``seconds`` (all rows): part of what a step costs."""
        d = self.overhead_decay
        self.overhead_s = d * self.overhead_s + (1 - d) * seconds

    def plain_step_seconds(self, rows: int) -> float:
        """A row's share of a plain step (one lone root per row): what an accepted token saves."""
        return float(self.cost.seconds[min(rows, self.cost.max_nodes)]) / rows

    def _curve(self, rows: int) -> VerifyCost:
        """The cost curve covering ``rows`` full trees (extended past its measured sizes)."""
        if rows not in self._curves:
            self._curves[rows] = extended_cost(self.cost, rows * (self.tree_budget + 1))
        return self._curves[rows]


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
    checked = verified[observed.bands_up_to(int(tokens.max()))[tokens]]
    if checked.all() or not checked.any():  # nothing to test, or nothing seen yet to price it by
        return best
    hopeful = np.where(checked, seconds, np.minimum(seconds, seconds[checked].min()))
    rates = gains / hopeful
    tried = int(np.argmax(np.where(checked, -np.inf, rates)))
    if rates[tried] > EXPLORE_GAIN * gains[best] / seconds[best]:
        return tried
    return best


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
