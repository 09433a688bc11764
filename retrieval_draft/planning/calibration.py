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
