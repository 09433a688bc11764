"""What verifying a tree of n nodes costs on this machine, and which n pays best.

On a CPU one forward over 16 new tokens costs about two single-token
forwards, on a GPU hardly more than one; so the tree size that maximises
accepted tokens per second depends on the device. ``VerifyCost`` holds
the curve, measured once per model and machine (``cost_probe``; ``cost_file`` keeps it on disk),
``ObservedCost`` corrects it with the forward times decoding sees, and
``TreePlanner.width`` picks the number of draft nodes that maximises expected
tokens per second given the nodes' estimated acceptance probabilities. On CPU the
measurement also times probed sizes with and without the skinny matmul
(``skinny_linear.py``) and keeps, per size, whichever was faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class VerifyCost:
    """Forward time by number of new tokens.

    Attributes:
        seconds: shape (max_nodes + 1,), float64; ``seconds[k]`` is the time of
            one forward over k new tokens (``seconds[0]`` unused, equal to ``seconds[1]``).
        skinny_sizes: tree sizes that should use the skinny matmul (``TreeModel(skinny_sizes=)``);
            None leaves ``TreeModel``'s default.
        steady: False when the machine's speed changed during the measurement
            (then the curve is used but not kept on disk).
    """

    seconds: np.ndarray
    skinny_sizes: frozenset | None = None
    steady: bool = True

    @property
    def max_nodes(self) -> int:
        return int(self.seconds.shape[0] - 1)

    @classmethod
    def from_points(
        cls, sizes, seconds, max_nodes: int = 64, skinny_sizes: frozenset | None = None, steady: bool = True
    ) -> "VerifyCost":
        """Linear interpolation through measured (size, seconds) points, non-decreasing (a dip is
        raised to the smaller sizes' level; ``cost_probe`` re-times spikes before this)."""
        grid = np.arange(max_nodes + 1, dtype=np.float64)
        curve = np.interp(grid, np.asarray(sizes, float), np.asarray(seconds, float))
        curve = np.maximum.accumulate(curve)
        curve[0] = curve[1]
        return cls(curve, skinny_sizes, steady)


class ObservedCost:
    """Corrects a cost curve with the forward times decoding actually sees, by rows and cache length.

    A curve measured while the machine was busy (or on a persisted file from
    another day) can have the wrong shape, and the planner then picks trees
    that cost more than they return. And the curve is measured at one cache length (the
    first decoding call's, or ``measure_cost``'s short prompt) and one row, while every tree node
    attends to the whole cache: after a 6k-token prompt each node costs more, and more so than a
    lone root, so trees sized by the short-cache curve are too large; a forward over B
    rows also reads B caches. Decoding times one forward per step; per band of rows
    (1, 2-3, 4-7, 8-15, 16 and more), of cache lengths (below 1k, 1-2k, 2-4k, 4-8k, 8k and
    more tokens) and of tree sizes in tokens (1, 2-3, 4-7, 8-15, 16-31, 32-64 and more) this
    keeps a smoothed ratio of observed to predicted seconds and scales that band of the curve
    by it (kept non-decreasing: no size costs more than a larger one). A size band never
    observed at a cache length takes its ratio from the longest shorter length band that
    observed it, and failing that keeps the measured values, raised to what a smaller
    observed size was seen to cost, until the planner tries it.

    Args:
        decay: weight of the old ratio in each update.
        min_count: observations in a band before ``drifted`` may report it.
    """

    BANDS = np.array([1, 2, 4, 8, 16, 32])
    LENGTH_BANDS = np.array([0, 1024, 2048, 4096, 8192])
    ROW_BANDS = np.array([1, 2, 4, 8, 16])

    def __init__(self, decay: float = 0.8, min_count: int = 8) -> None:
        self.decay = decay
        self.min_count = min_count
        shape = (self.ROW_BANDS.shape[0], self.LENGTH_BANDS.shape[0], self.BANDS.shape[0])
        self.ratio = np.ones(shape)
        self.count = np.zeros(shape, dtype=np.int64)

    @staticmethod
    def _index(edges: np.ndarray, value: int) -> int:
        return max(int(np.searchsorted(edges, value, side="right") - 1), 0)

    def observe(self, cost: VerifyCost, size: int, seconds: float, cache_len: int = 0, rows: int = 1) -> None:
        """One forward over ``rows`` rows, ``size`` new tokens in all, after ``cache_len`` cached
        ones took ``seconds`` (``cost``: the curve covering that size)."""
        if size < 1 or size > cost.max_nodes or seconds <= 0:
            return
        cell = (self._index(self.ROW_BANDS, rows), self._index(self.LENGTH_BANDS, cache_len), self._index(self.BANDS, size))
        ratio = seconds / float(cost.seconds[size])
        d = self.decay if self.count[cell] else 0.0
        self.ratio[cell] = d * self.ratio[cell] + (1 - d) * ratio
        self.count[cell] += 1

    def apply(self, cost: VerifyCost, cache_len: int = 0, rows: int = 1) -> VerifyCost:
        """``cost`` with every observed band scaled by its ratio for ``rows`` rows at ``cache_len`` cached tokens."""
        ratio, seen = self._at(self._index(self.ROW_BANDS, rows), self._index(self.LENGTH_BANDS, cache_len))
        if not seen.any():
            return cost
        sizes = np.arange(cost.seconds.shape[0])
        bands = np.clip(np.searchsorted(self.BANDS, sizes, side="right") - 1, 0, None)
        seen_size = seen[bands]
        corrected = cost.seconds * ratio[bands]
        # An unobserved size costs at least what a smaller observed one was seen to cost (after
        # a long prompt the measured short-cache values of big trees are too cheap) ...
        floor = np.maximum.accumulate(np.where(seen_size, corrected, 0.0))
        corrected = np.where(seen_size, corrected, np.maximum(corrected, floor))
        # ... and no size costs more than a larger one (non-decreasing again).
        seconds = np.minimum.accumulate(corrected[::-1])[::-1]
        seconds[0] = seconds[1]
        return VerifyCost(seconds, cost.skinny_sizes, cost.steady)

    def _at(self, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Per size band: the ratio of the longest length band up to ``length`` that observed it
        (for row band ``rows``), and whether any did."""
        ratio, seen = np.ones(self.BANDS.shape[0]), np.zeros(self.BANDS.shape[0], dtype=bool)
        for band in range(length + 1):
            observed = self.count[rows, band] > 0
            ratio[observed], seen[observed] = self.ratio[rows, band][observed], True
        return ratio, seen

    def drifted(self, low: float = 0.7, high: float = 1.4) -> bool:
        """Whether some well-observed band of one row at the measured cache length (below 1k tokens) is off
        the measured curve by more than the given factors."""
        seen = self.count[0, 0] >= self.min_count
        return bool(np.any(seen & ((self.ratio[0, 0] < low) | (self.ratio[0, 0] > high))))

    def faster(self, low: float = 0.7) -> bool:
        """Whether the machine proved faster than the curve: some well-observed band ran below
        ``low`` times its measured cost and none ran slower than measured. Only such a
        correction is worth keeping on disk: forwards cannot run faster than the idle machine
        allows, while slower ones may only mean that other work shared the cores for a while."""
        seen = self.count[0, 0] >= self.min_count
        return bool(np.any(seen & (self.ratio[0, 0] < low)) and not np.any(seen & (self.ratio[0, 0] > 1.0)))
