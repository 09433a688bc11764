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

import bisect
from dataclasses import dataclass, replace

import numba
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
        row_by_row: the skinny matmul walks the weights row by row for few rows on this machine
            (``skinny_linear.walks_faster``, decided when the curve's measurement starts; ``TreeModel.row_by_row``).
    """

    seconds: np.ndarray
    skinny_sizes: frozenset | None = None
    steady: bool = True
    row_by_row: bool = False

    @property
    def max_nodes(self) -> int:
        return int(self.seconds.shape[0] - 1)

    @classmethod
    def from_points(
        cls, sizes, seconds, max_nodes: int = 64, skinny_sizes: frozenset | None = None, steady: bool = True,
        row_by_row: bool = False,
    ) -> "VerifyCost":
        """Linear interpolation through measured (size, seconds) points, non-decreasing (a dip is
        raised to the smaller sizes' level; ``cost_probe`` re-times spikes before this)."""
        grid = np.arange(max_nodes + 1, dtype=np.float64)
        curve = np.interp(grid, np.asarray(sizes, float), np.asarray(seconds, float))
        curve = np.maximum.accumulate(curve)
        curve[0] = curve[1]
        return cls(curve, skinny_sizes, steady, row_by_row)


# What a forward can plausibly cost, in lone roots (one forward over one new token):
CPU_SLACK = 1.5  # on a CPU a forward over k new tokens costs at most about k lone roots; this much more is noise
GPU_FLAT_TOKENS = 8  # on a GPU a tree of up to this many tokens costs about one lone root ...
GPU_SLACK = 3.0  # ... within this factor (a launch-bound VM measured 2-3 lone roots for 2-7 nodes)


def stepped(cost: VerifyCost, widths: tuple[int, ...]) -> VerifyCost:
    """``cost`` as static steps pay it (``model.static_shapes``): a tree of n nodes runs padded to
    the smallest of ``widths`` (increasing) that holds it, so it costs that width's forward. The
    curve ends at the widest width (or where it ended, if that comes first)."""
    top = min(cost.max_nodes, widths[-1])
    sizes = np.arange(top + 1)
    padded = np.asarray(widths)[np.searchsorted(widths, np.maximum(sizes, 1))]
    seconds = cost.seconds[np.minimum(padded, cost.max_nodes)]
    return replace(cost, seconds=seconds)


def plausible_limit(lone_seconds: float, sizes: np.ndarray, gpu: bool = False) -> np.ndarray:
    """Most seconds a forward over each of ``sizes`` (shape (m,), new tokens) can plausibly take on a
    machine whose lone root takes ``lone_seconds``: k lone roots on a CPU, about one lone root per
    ``GPU_FLAT_TOKENS`` tokens on a GPU, each with its slack; shape (m,) float64."""
    sizes = np.maximum(np.asarray(sizes, dtype=np.float64), 1.0)
    if gpu:
        return GPU_SLACK * lone_seconds * np.maximum(1.0, sizes / GPU_FLAT_TOKENS)
    return CPU_SLACK * lone_seconds * sizes


def implausible_sizes(cost: VerifyCost, gpu: bool = False) -> np.ndarray:
    """Tree sizes (new tokens) at which ``cost`` claims more than ``plausible_limit`` allows, shape (m,).
    One spell of other work during a measurement leaves such sizes (a real cache held 11.6 lone
    roots for 3 tokens), and a planner that believes them never verifies the trees that would
    correct them."""
    sizes = np.arange(cost.seconds.shape[0])
    return np.flatnonzero(cost.seconds > plausible_limit(float(cost.seconds[1]), sizes, gpu))


def plausible(cost: VerifyCost, gpu: bool = False) -> bool:
    """Whether ``cost`` stays within ``plausible_limit`` at every size (then it may be kept on disk)."""
    return implausible_sizes(cost, gpu).size == 0


def clamped(cost: VerifyCost, gpu: bool = False) -> VerifyCost:
    """``cost`` with every size lowered to its ``plausible_limit`` (still non-decreasing)."""
    sizes = np.arange(cost.seconds.shape[0])
    seconds = np.minimum(cost.seconds, plausible_limit(float(cost.seconds[1]), sizes, gpu))
    return replace(cost, seconds=seconds)


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

    An observation ages: a band not observed for ``expire_forwards`` forwards is no longer
    ``verified`` (the planner may try it again, ``TreePlanner.width``), and its next observation
    replaces the old ratio instead of being averaged into it, so a ratio seen during a busy
    spell is not carried for good.

    Args:
        decay: weight of the old ratio in each update.
        min_count: observations in a band before ``drifted`` may use it.
        expire_forwards: forwards after which a band's last observation no longer verifies it.
    """

    BANDS = np.array([1, 2, 4, 8, 16, 32])
    LENGTH_BANDS = np.array([0, 1024, 2048, 4096, 8192])
    ROW_BANDS = np.array([1, 2, 4, 8, 16])

    def __init__(self, decay: float = 0.8, min_count: int = 8, expire_forwards: int = 1024) -> None:
        self.decay = decay
        self.min_count = min_count
        self.expire_forwards = expire_forwards
        shape = (self.ROW_BANDS.shape[0], self.LENGTH_BANDS.shape[0], self.BANDS.shape[0])
        self.ratio = np.ones(shape)
        self.count = np.zeros(shape, dtype=np.int64)
        self.seen_at = np.zeros(shape, dtype=np.int64)  # the forward number of each band's last observation
        self.forwards = 0
        self._bands: dict[int, np.ndarray] = {}  # curve length -> band of each size (``bands_up_to``)

    @staticmethod
    def _index(edges: np.ndarray, value: int) -> int:
        return max(bisect.bisect_right(edges, value) - 1, 0)  # a few edges: bisect beats a numpy call

    def size_bands(self, sizes: np.ndarray) -> np.ndarray:
        """The size band (index into ``BANDS``) of each forward size in ``sizes`` (new tokens)."""
        return np.clip(np.searchsorted(self.BANDS, sizes, side="right") - 1, 0, None)

    def observe(self, cost: VerifyCost, size: int, seconds: float, cache_len: int = 0, rows: int = 1) -> None:
        """One forward over ``rows`` rows, ``size`` new tokens in all, after ``cache_len`` cached
        ones took ``seconds`` (``cost``: the curve covering that size)."""
        if size < 1 or size > cost.max_nodes or seconds <= 0:
            return
        self.forwards += 1
        cell = (*self.cell(rows, cache_len), self._index(self.BANDS, size))
        ratio = seconds / float(cost.seconds[size])
        fresh = self.count[cell] and self.forwards - self.seen_at[cell] <= self.expire_forwards
        d = self.decay if fresh else 0.0
        self.ratio[cell] = d * self.ratio[cell] + (1 - d) * ratio
        self.count[cell] = self.count[cell] + 1 if fresh else 1
        self.seen_at[cell] = self.forwards

    def apply(self, cost: VerifyCost, cache_len: int = 0, rows: int = 1) -> VerifyCost:
        """``cost`` with every observed band scaled by its ratio for ``rows`` rows at ``cache_len`` cached tokens."""
        ratio, seen = self._at(*self.cell(rows, cache_len))
        if not seen.any():
            return cost
        return replace(cost, seconds=corrected_curve(cost.seconds, ratio, seen, self.bands_up_to(cost.max_nodes)))

    def bands_up_to(self, max_nodes: int) -> np.ndarray:
        """``size_bands`` of every size 0..``max_nodes`` (shape (max_nodes + 1,)), kept per length."""
        if max_nodes not in self._bands:
            self._bands[max_nodes] = self.size_bands(np.arange(max_nodes + 1))
        return self._bands[max_nodes]

    def cell(self, rows: int, cache_len: int = 0) -> tuple[int, int]:
        """The (row band, length band) of a forward over ``rows`` rows after ``cache_len`` cached tokens."""
        return self._index(self.ROW_BANDS, rows), self._index(self.LENGTH_BANDS, cache_len)

    def _at(self, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Per size band: the ratio of the longest length band up to ``length`` that observed it
        (for row band ``rows``), and whether any did."""
        return latest_ratios(self.ratio[rows], self.count[rows], length)

    def verified(self, cache_len: int = 0, rows: int = 1) -> np.ndarray:
        """(len(BANDS),) bool: size bands whose cost ``apply`` takes from an observation of the last
        ``expire_forwards`` forwards (for ``rows`` rows, at ``cache_len`` or a shorter length band)."""
        row, length = self.cell(rows, cache_len)
        return recent_bands(self.count[row], self.seen_at[row], length, self.forwards, self.expire_forwards)

    def drifted(self, low: float = 0.7, high: float = 1.4) -> bool:
        """Whether some well-observed band of one row at the measured cache length (below 1k tokens) is off
        the measured curve by more than the given factors."""
        seen = self.count[0, 0] >= self.min_count
        return bool(np.any(seen & ((self.ratio[0, 0] < low) | (self.ratio[0, 0] > high))))

    def proven_cheaper(self, cost: VerifyCost, low: float = 0.7, min_count: int = 2) -> VerifyCost | None:
        """``cost`` lowered where the machine proved it too dear, or None where it did not: the
        well-observed one-row, short-cache bands that ran below ``low`` times their measured cost
        take their observed ratio (kept non-decreasing). Only such a correction is worth keeping on
        disk: forwards cannot run faster than the idle machine allows, while slower ones may only
        mean that other work shared the cores for a while, so no band is raised, and ``min_count``
        forwards in a band suffice."""
        seen = self.count[0, 0] >= min_count
        cheaper = seen & (self.ratio[0, 0] < low)
        if not cheaper.any():
            return None
        factor = np.where(cheaper, self.ratio[0, 0], 1.0)[self.size_bands(np.arange(cost.seconds.shape[0]))]
        seconds = np.minimum.accumulate((cost.seconds * factor)[::-1])[::-1]
        seconds[0] = seconds[1]
        return replace(cost, seconds=seconds)


@numba.njit(cache=True, nogil=True)
def corrected_curve(seconds: np.ndarray, ratio: np.ndarray, seen: np.ndarray, bands: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """``ObservedCost.apply``'s curve: ``seconds`` (n,) scaled by the ratio of each size's band
    (``bands`` (n,) into ``ratio`` / ``seen`` (b,)); an unobserved size costs at least what a smaller
    observed one was seen to cost (after a long prompt the measured short-cache values of big trees
    are too cheap), and no size costs more than a larger one (non-decreasing again)."""
    n = seconds.shape[0]
    out = np.empty(n)
    floor = 0.0
    for k in range(n):
        band = bands[k]
        value = seconds[k] * ratio[band]
        if seen[band]:
            floor = max(floor, value)
            out[k] = value
        else:
            out[k] = max(value, floor)
    for k in range(n - 2, -1, -1):
        out[k] = min(out[k], out[k + 1])
    out[0] = out[1]
    return out


@numba.njit(cache=True, nogil=True)
def latest_ratios(ratio: np.ndarray, count: np.ndarray, length: int):  # pragma: no cover - compiled
    """For one row band's cells (``ratio``, ``count``: (length bands, size bands)): per size band the
    ratio of the longest length band up to ``length`` that observed it (1.0 where none did), and
    whether any did; each (size bands,)."""
    bands = ratio.shape[1]
    out = np.ones(bands)
    seen = np.zeros(bands, np.bool_)
    for band in range(length + 1):
        for size in range(bands):
            if count[band, size] > 0:
                out[size] = ratio[band, size]
                seen[size] = True
    return out, seen


@numba.njit(cache=True, nogil=True)
def recent_bands(count: np.ndarray, seen_at: np.ndarray, length: int, forwards: int, expire: int) -> np.ndarray:  # pragma: no cover - compiled
    """For one row band's cells (``count``, ``seen_at``: (length bands, size bands)): per size band
    whether a length band up to ``length`` observed it within the last ``expire`` of ``forwards``
    forwards; (size bands,) bool."""
    bands = count.shape[1]
    out = np.zeros(bands, np.bool_)
    for band in range(length + 1):
        for size in range(bands):
            if count[band, size] > 0 and forwards - seen_at[band, size] <= expire:
                out[size] = True
    return out
