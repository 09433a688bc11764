"""Turning drafters' guesses into measured acceptance probabilities.

Drafters score their tokens with heuristics (match length, counts). The
engine sees, every step, which tested draft nodes the model accepted; the
``AcceptanceCalibrator`` keeps, per bucket of raw conditional probability,
a decayed count of hits and trials, and maps a raw guess to the observed
rate. Decay lets it follow a drifting workload and, by sliding back toward
the prior, makes it test drafts again after a bad stretch.
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.tree import DraftTree


class AcceptanceCalibrator:
    """Raw conditional probability -> observed acceptance rate.

    Args:
        buckets: equal-width bins over [0, 1].
        prior_weight: pseudo-trials at the bucket's own raw value.
        decay: factor applied to all counts at every update (per step).
    """

    def __init__(self, buckets: int = 10, prior_weight: float = 4.0, decay: float = 0.99) -> None:
        self.edges = np.linspace(0.0, 1.0, buckets + 1)
        self.centers = (self.edges[:-1] + self.edges[1:]) / 2
        self.prior_weight = prior_weight
        self.decay = decay
        self.hits = np.zeros(buckets)
        self.trials = np.zeros(buckets)

    def _bucket(self, raw: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(self.edges, raw, side="right") - 1, 0, self.centers.shape[0] - 1)

    def rates(self, raw: np.ndarray) -> np.ndarray:
        """Calibrated probabilities, same shape as ``raw`` (values in [0, 1])."""
        b = self._bucket(raw)
        prior = self.prior_weight
        return (self.hits[b] + prior * self.centers[b]) / (self.trials[b] + prior)

    def update(self, raw: np.ndarray, accepted: np.ndarray) -> None:
        """Record outcomes: ``raw`` shape (k,) guesses, ``accepted`` shape (k,) bool."""
        self.hits *= self.decay
        self.trials *= self.decay
        b = self._bucket(raw)
        np.add.at(self.trials, b, 1.0)
        np.add.at(self.hits, b, accepted.astype(np.float64))

    def path_probs(self, tree: DraftTree) -> np.ndarray:
        """Calibrated probability that each node is accepted, shape (n,) (root 1.0).

        The product of calibrated conditionals along the path, so a child never
        exceeds its parent.
        """
        conditional = self.rates(conditional_probs(tree))
        conditional[0] = 1.0
        path = conditional.copy()
        for depth in range(1, int(tree.depths.max(initial=0)) + 1):
            level = tree.depths == depth
            path[level] = conditional[level] * path[tree.parents[level]]
        return path

    def observe(self, tree: DraftTree, accepted: np.ndarray) -> None:
        """Learn from one verification: the nodes tested were the children of the root
        and of every accepted node; ``accepted`` holds the accepted node indices."""
        reached = np.zeros(tree.size, dtype=bool)
        reached[0] = True
        reached[accepted] = True
        tested = np.flatnonzero(reached[np.maximum(tree.parents, 0)])
        tested = tested[tested > 0]
        if tested.size:
            self.update(conditional_probs(tree)[tested], np.isin(tested, accepted))


def conditional_probs(tree: DraftTree) -> np.ndarray:
    """Each node's raw probability divided by its parent's, shape (n,) (root 1.0)."""
    parent_probs = tree.probs[np.maximum(tree.parents, 0)]
    conditional = np.divide(tree.probs, parent_probs, out=np.ones_like(tree.probs), where=parent_probs > 0)
    conditional[0] = 1.0
    return np.clip(conditional, 0.0, 1.0)
