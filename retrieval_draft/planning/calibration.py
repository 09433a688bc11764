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

    def _cells(self, raw: np.ndarray, depths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(depth band, bucket) of each conditional probability ``raw`` (shape (n,)) at ``depths``
        (shape (n,), 0 = a draft's first token; default one draft's 0..n-1)."""
        bucket = np.searchsorted(self.edges, raw, side="right") - 1
        np.maximum(np.minimum(bucket, self.centers.shape[0] - 1, out=bucket), 0, out=bucket)
        if depths is None:
            depths = np.arange(raw.shape[0])
        band = np.searchsorted(DEPTH_BANDS, depths, side="right") - 1
        return band, bucket

    def rates(self, raw: np.ndarray, depths: np.ndarray | None = None) -> np.ndarray:
        """Calibrated conditional probabilities, shape (n,): of one draft's tokens ``raw`` (shape (n,)),
        or, with ``depths`` (shape (n,), each token's index in its draft), of many drafts' tokens at once."""
        band, bucket = self._cells(raw, depths)
        w = self.prior_weight
        pooled = (self.hits.sum(0) + w * self.prior_scale * self.centers) / (self.trials.sum(0) + w)
        return (self.hits[band, bucket] + w * pooled[bucket]) / (self.trials[band, bucket] + w)

    def decay_counts(self) -> None:
        """Age every count once (call once per step)."""
        self.hits *= self.decay
        self.trials *= self.decay

    def grade(self, raw: np.ndarray, draft_tokens: np.ndarray, truth: np.ndarray, skip: int = 0) -> None:
        """Record one draft's outcome against the model's tokens ``truth`` (shape (t,)).

        ``raw``: shape (n,), the draft's conditional probabilities; the first
        wrong token is the last one tested. The first ``skip`` tokens are left
        out (another draft of the same drafter already graded that prefix).
        """
        n = min(draft_tokens.shape[0], truth.shape[0])
        wrong = np.flatnonzero(draft_tokens[:n] != truth[:n])
        tested = int(wrong[0]) + 1 if wrong.size else n
        right = tested - 1 if wrong.size else tested
        if tested <= skip:
            return
        band, bucket = self._cells(raw[:tested])
        np.add.at(self.trials, (band[skip:], bucket[skip:]), 1.0)
        np.add.at(self.hits, (band[skip:right], bucket[skip:right]), 1.0)

    def record(self, raw: np.ndarray, depths: np.ndarray, right: np.ndarray) -> None:
        """Record tested tokens: conditional probabilities ``raw``, their indices in their drafts
        ``depths`` and whether each was right, all shape (n,); each entry one trial."""
        band, bucket = self._cells(raw, depths)
        np.add.at(self.trials, (band, bucket), 1.0)
        np.add.at(self.hits, (band[right], bucket[right]), 1.0)


RANK_BANDS = np.array([1, 2, 3, 5, 9, 17, 33])  # band b holds ranks in [RANK_BANDS[b], RANK_BANDS[b + 1])


def rank_bands(ranks: np.ndarray) -> np.ndarray:
    """The band (index into ``RANK_BANDS``) of each rank (1 = a tree's most probable draft node)."""
    return np.searchsorted(RANK_BANDS, ranks, side="right") - 1


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
    """

    def __init__(self, prior_weight: float = 2.0, decay: float = 0.995, bounds: tuple[float, float] = (0.05, 2.0)) -> None:
        self.prior_weight = prior_weight
        self.decay = decay
        self.bounds = bounds
        self.promised = np.zeros(RANK_BANDS.shape[0])
        self.delivered = np.zeros(RANK_BANDS.shape[0])

    def factors(self, count: int) -> np.ndarray:
        """(count,) the correction of ranks 1..count."""
        w = self.prior_weight
        ratio = np.clip((self.delivered + w) / (self.promised + w), *self.bounds)
        return ratio[rank_bands(np.arange(1, count + 1))]

    def record(self, ranks: np.ndarray, probs: np.ndarray, confirmed: np.ndarray) -> None:
        """One tree's decided draft nodes: ``ranks`` (n,) each node's place by decreasing probability
        among all the tree's draft nodes (1 = the most probable), ``probs`` (n,) the probability the
        planner gave it, ``confirmed`` (n,) bool whether the model's tokens confirmed it."""
        self.promised *= self.decay
        self.delivered *= self.decay
        bands = rank_bands(ranks)
        size = RANK_BANDS.shape[0]
        self.promised += np.bincount(bands, weights=probs, minlength=size)
        self.delivered += np.bincount(bands, weights=confirmed.astype(np.float64), minlength=size)
