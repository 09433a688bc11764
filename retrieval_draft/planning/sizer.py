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

from dataclasses import replace

import numba
import numpy as np

from retrieval_draft.config import DEFAULTS, check_setting
from retrieval_draft.planning.cost import ObservedCost, VerifyCost, corrected_curve, latest_ratios, recent_bands
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

    @property
    def row_by_row(self) -> bool:
        """Whether the skinny matmul walks the weights row by row on this machine (``TreeModel.row_by_row``):
        the measurement's choice, or the curve's."""
        if self.probe is not None:
            return self.probe.row_by_row
        return self.cost.row_by_row if self.cost is not None else False

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
        curve, observed = self._curve(rows), self.observed
        row, length = observed.cell(rows, cache_len)
        flat = ranked[0] if rows == 1 else np.concatenate(ranked)
        lengths = np.array([probs.shape[0] for probs in ranked], dtype=np.int64)
        return int(_best_width(
            flat.astype(np.float64, copy=False), lengths, curve.seconds, observed.ratio[row], observed.count[row],
            observed.seen_at[row], length, observed.forwards, observed.expire_forwards,
            observed.bands_up_to(curve.max_nodes), self.overhead_s, self.probe is None,
        ))

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


@numba.njit(cache=True, nogil=True)
def _best_width(flat, lengths, curve, ratio, count, seen_at, length, forwards, expire, bands, overhead_s, explore):  # pragma: no cover - compiled
    """``TreeSizer.width`` in one compiled pass.

    Args:
        flat, lengths: the rows' candidate probabilities, decreasing within a row, laid end to end
            (row r is the next ``lengths[r]`` entries); (m,) float64 and (B,) int64.
        curve: (N + 1,) seconds of a forward over 0..N new tokens (the curve covering B full trees).
        ratio, count, seen_at, length, forwards, expire: ``ObservedCost``'s cells for B rows (each
            (length bands, size bands)), the cache length's band, its forward count and expiry.
        bands: (N + 1,) the size band of every forward size.
        overhead_s: drafting seconds per step.
        explore: whether a wider tree may test the curve (``explored_width``).
    """
    rows = lengths.shape[0]
    most = 0
    for r in range(rows):
        most = max(most, lengths[r])
    column = np.zeros(most)  # the rows' probabilities summed by rank (a short row adds nothing past its end)
    start = 0
    for r in range(rows):
        for j in range(lengths[r]):
            column[j] += flat[start + j]
        start += lengths[r]
    gains = np.empty(most + 1)  # a step's expected tokens: one bonus per row plus the kept nodes
    gains[0] = rows
    total = 0.0
    for j in range(most):
        total += column[j]
        gains[j + 1] = rows + total
    correction, seen = latest_ratios(ratio, count, length)
    observed = False
    for band in range(seen.shape[0]):
        observed = observed or seen[band]
    priced = corrected_curve(curve, correction, seen, bands) if observed else curve
    top = curve.shape[0] - 1
    tokens = np.empty(most + 1, np.int64)
    seconds = np.empty(most + 1)
    for w in range(most + 1):
        tokens[w] = min(rows * (w + 1), top)
        seconds[w] = priced[tokens[w]] + overhead_s
    best = best_rate(gains, seconds)
    if not explore:
        return best
    recent = recent_bands(count, seen_at, length, forwards, expire)
    checked = np.empty(most + 1, np.bool_)
    for w in range(most + 1):
        checked[w] = recent[bands[tokens[w]]]
    return explored_width(gains, seconds, checked, best)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def best_rate(gains: np.ndarray, seconds: np.ndarray) -> int:  # pragma: no cover - compiled
    """``np.argmax(gains / seconds)`` for (W,) arrays, W >= 1: the first width of the most tokens per
    second, or the first NaN rate. A loop: Numba compiles the array division and argmax in ~0.5 s."""
    best = 0
    for w in range(gains.shape[0]):
        rate = gains[w] / seconds[w]
        if np.isnan(rate):
            return w
        if rate > gains[best] / seconds[best]:
            best = w
    return best


@numba.njit(cache=True, nogil=True)
def explored_width(gains: np.ndarray, seconds: np.ndarray, checked: np.ndarray, best: int) -> int:  # pragma: no cover - compiled
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
        checked: (W,) bool, whether a recent forward verified the size band of each.
        best: the width that ``seconds`` says pays best.
    """
    cheapest, verified, unverified = np.inf, False, False
    for w in range(checked.shape[0]):
        if checked[w]:
            cheapest, verified = min(cheapest, seconds[w]), True
        else:
            unverified = True
    if not (verified and unverified):  # nothing to test, or nothing seen yet to price it by
        return best
    tried, tried_rate = -1, -np.inf
    for w in range(checked.shape[0]):
        if not checked[w]:
            rate = gains[w] / min(seconds[w], cheapest)
            if tried < 0 or rate > tried_rate:
                tried, tried_rate = w, rate
    if tried_rate > EXPLORE_GAIN * gains[best] / seconds[best]:
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
    return replace(cost, seconds=np.concatenate([known, extra]))
