"""Turning drafters' guesses into measured acceptance probabilities.

Drafters score their tokens with heuristics (match length, counts). After
every step the engine knows what the model actually produced (accepted
tokens plus the bonus token), so it can grade every draft token it was
offered, including the ones the planner pruned: a token is *tested* when all
tokens before it in its draft were right, and *right* when it equals the
model's token at that depth. The ``AcceptanceCalibrator`` keeps decayed
counts of right and tested per cell (depth band x bucket of the drafter's
raw conditional probability) and maps a raw guess to the observed rate.
"""

from __future__ import annotations

import numba
import numpy as np

DEPTH_BANDS = np.array([0, 1, 2, 4, 8])  # band b holds depths in [DEPTH_BANDS[b], DEPTH_BANDS[b + 1])
# Buckets of the raw probability; finer near 1, where a long chain's worth
# hangs on the difference between 0.9 and 0.98 per token.
PROB_EDGES = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.94, 0.97, 0.99, 1.0])


class AcceptanceCalibrator:
    """Raw conditional probability (and depth) -> observed acceptance rate, for one drafter.

    Estimates shrink in two stages: a cell (depth band, bucket) leans on its
    bucket's rate pooled over all depths, and that pooled rate leans on a
    sceptical prior, ``prior_scale`` times the bucket's raw value. Drafts are
    graded even when the planner prunes them, so scepticism costs no learning.

    Args:
        edges: bucket edges of the raw probability, increasing from 0 to 1.
        prior_weight: pseudo-trials behind each stage's prior.
        prior_scale: the prior believes raw guesses are this many times too high, inverted.
        decay: factor applied to all counts at every update (one per step).
    """

    def __init__(
        self, edges: np.ndarray = PROB_EDGES, prior_weight: float = 4.0, prior_scale: float = 0.5, decay: float = 0.995
    ) -> None:
        self.edges = np.asarray(edges, dtype=np.float64)
        if self.edges[0] != 0.0 or self.edges[-1] != 1.0 or np.any(np.diff(self.edges) <= 0):
            raise ValueError("edges must increase from 0 to 1")
        buckets = self.edges.shape[0] - 1
        self.centers = (self.edges[:-1] + self.edges[1:]) / 2
        self.prior_weight = prior_weight
        self.prior_scale = prior_scale
        self.decay = decay
        self.hits = np.zeros((DEPTH_BANDS.shape[0], buckets))
        self.trials = np.zeros((DEPTH_BANDS.shape[0], buckets))

    def rates(self, raw: np.ndarray, depths: np.ndarray | None = None) -> np.ndarray:
        """Calibrated conditional probabilities, shape (n,): of one draft's tokens ``raw`` (shape (n,)),
        or, with ``depths`` (shape (n,), each token's index in its draft), of many drafts' tokens at once."""
        if depths is None:
            depths = np.arange(raw.shape[0])
        return _rates(self.hits, self.trials, self.centers, self.edges, DEPTH_BANDS, float(self.prior_weight),
                      float(self.prior_scale), np.asarray(raw, dtype=np.float64), np.asarray(depths, dtype=np.int64))

    def decay_counts(self) -> None:
        """Age every count once (call once per step)."""
        self.hits *= self.decay
        self.trials *= self.decay

    def record(self, raw: np.ndarray, depths: np.ndarray, right: np.ndarray) -> None:
        """Record tested tokens: conditional probabilities ``raw``, their indices in their drafts
        ``depths`` and whether each was right, all shape (n,); each entry one trial."""
        _record(self.trials, self.hits, self.edges, DEPTH_BANDS, np.asarray(raw, dtype=np.float64),
                np.asarray(depths, dtype=np.int64), np.asarray(right, dtype=np.bool_))


RANK_BANDS = np.array([1, 2, 3, 5, 9, 17, 33])  # band b holds ranks in [RANK_BANDS[b], RANK_BANDS[b + 1])


@numba.njit(cache=True, nogil=True)
def _cell(edges: np.ndarray, depth_edges: np.ndarray, raw: float, depth: int) -> tuple[int, int]:  # pragma: no cover - compiled
    """(depth band, bucket) of one conditional probability ``raw`` at ``depth`` (the bucket clipped
    to the edges' range)."""
    bucket = min(max(_at_or_below(edges, raw) - 1, 0), edges.shape[0] - 2)
    return _at_or_below(depth_edges, depth) - 1, bucket


@numba.njit(cache=True, nogil=True)
def _at_or_below(edges: np.ndarray, value) -> int:  # pragma: no cover - compiled
    """``np.searchsorted(edges, value, side="right")`` for sorted ``edges`` (n,): how many are not
    above ``value`` (n for NaN). A scan of a few edges; Numba compiles it in a fraction of the time
    ``searchsorted`` takes."""
    i = 0
    while i < edges.shape[0] and not value < edges[i]:
        i += 1
    return i


@numba.njit(cache=True, nogil=True)
def _rates(hits, trials, centers, edges, depth_edges, weight, scale, raw, depths):  # pragma: no cover - compiled
    """``AcceptanceCalibrator.rates`` in one pass: each cell leans on its bucket pooled over the
    depth bands, which leans on ``scale`` times the bucket's centre; (n,) float64."""
    bands, buckets = hits.shape
    pooled = np.empty(buckets)
    for bucket in range(buckets):
        right = 0.0
        tested = 0.0
        for band in range(bands):
            right += hits[band, bucket]
            tested += trials[band, bucket]
        pooled[bucket] = (right + weight * scale * centers[bucket]) / (tested + weight)
    out = np.empty(raw.shape[0])
    for i in range(raw.shape[0]):
        band, bucket = _cell(edges, depth_edges, raw[i], depths[i])
        out[i] = (hits[band, bucket] + weight * pooled[bucket]) / (trials[band, bucket] + weight)
    return out


@numba.njit(cache=True, nogil=True)
def _record(trials, hits, edges, depth_edges, raw, depths, right) -> None:  # pragma: no cover - compiled
    """``AcceptanceCalibrator.record``: one trial per token in its cell, one hit where ``right``."""
    for i in range(raw.shape[0]):
        band, bucket = _cell(edges, depth_edges, raw[i], depths[i])
        trials[band, bucket] += 1.0
        if right[i]:
            hits[band, bucket] += 1.0


class RankCorrection:
    """What the merged tree's r-th most probable node delivers against what its probability promised.

    Each drafter's rates are calibrated on its own drafts, but a tree ranks all drafters' nodes
    together, and its lower ranks hold sibling alternatives whose rates were learned over every
    step, including the steps where the drafters agreed: on open chat and retrieval-augmented
    questions (SmolLM2-135M) the 8th-16th nodes delivered a sixth of the probability they were
    given. Per band of ranks this keeps decayed sums of the probability the planner gave the
    full candidate tree's nodes and of the nodes the model's tokens confirmed (nodes the step's
    tokens cannot decide, below the bonus token, are left out), and the planner scales a ranked
    probability by their ratio when it sizes the tree (never when it orders the nodes).

    Args:
        prior_weight: pseudo-tokens of probability behind the prior ratio of 1.
        decay: factor applied to the sums once per ``record`` (one per step and row).
        bounds: the ratio is clipped to this range.
        edges: (b,) increasing ranks, band i holding ranks in [edges[i], edges[i + 1]) (the last
            band: from its edge on); default ``RANK_BANDS``. The vLLM route keeps one over the
            positions of the chains it sends (``integrations.step_cost.ChainCorrection``).
    """

    def __init__(self, prior_weight: float = 2.0, decay: float = 0.995, bounds: tuple[float, float] = (0.05, 2.0),
                 edges: np.ndarray = RANK_BANDS) -> None:
        self.prior_weight = prior_weight
        self.decay = decay
        self.bounds = bounds
        self.edges = edges
        self.promised = np.zeros(edges.shape[0])
        self.delivered = np.zeros(edges.shape[0])

    def bands(self, ranks: np.ndarray) -> np.ndarray:
        """The band (index into ``edges``) of each rank (1 = a tree's most probable draft node)."""
        return self.edges.searchsorted(ranks, side="right") - 1  # the method: no Python wrapper

    def factors(self, count: int) -> np.ndarray:
        """(count,) the correction of ranks 1..count."""
        w = self.prior_weight
        ratio = np.clip((self.delivered + w) / (self.promised + w), *self.bounds)
        return ratio[self.bands(np.arange(1, count + 1))]

    def record(self, ranks: np.ndarray, probs: np.ndarray, confirmed: np.ndarray) -> None:
        """One tree's decided draft nodes: ``ranks`` (n,) each node's place by decreasing probability
        among all the tree's draft nodes (1 = the most probable), ``probs`` (n,) the probability the
        planner gave it, ``confirmed`` (n,) bool whether the model's tokens confirmed it."""
        self.promised *= self.decay
        self.delivered *= self.decay
        bands = self.bands(ranks)
        size = self.edges.shape[0]
        self.promised += np.bincount(bands, weights=probs, minlength=size)
        self.delivered += np.bincount(bands, weights=confirmed.astype(np.float64), minlength=size)
