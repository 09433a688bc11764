"""What verifying a tree of n nodes costs on this machine, and which n pays best.

On a CPU one forward over 16 new tokens costs about two single-token
forwards, on a GPU hardly more than one; so the tree size that maximises
accepted tokens per second depends on the device. ``VerifyCost`` measures
the curve once per model and machine (``cost_file`` keeps it on disk), and
``TreePlanner.width`` picks the number of draft nodes that maximises expected
tokens per second given the nodes' estimated acceptance probabilities. On CPU the
measurement also times probed sizes with and without the skinny matmul
(``skinny_linear.py``) and keeps, per size, whichever was faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from retrieval_draft.planning.timing import ForwardTimer
from retrieval_draft.model.skinny_linear import SKINNY_ROWS

# Probed tree sizes, one timed forward each (two where the skinny kernel competes and the plain path
# is not already beaten): the first call of a process with no stored curve pays for this, 1.6-1.9 s for
# SmolLM2-135M on a 2-core AMD EPYC, against 3.4-4.1 s for sizes up to 64, both paths timed at 1-16,
# after a 256-token prompt (and 8.7 s for 12 sizes x 3 repeats before that, which made a first short
# generation slower than plain ``generate``). Sizes between probes are interpolated, larger ones
# extrapolated (``planner.extended_cost``), and ``ObservedCost`` corrects the curve from the forwards
# decoding times, per band of cache length too: the probes run after a short prompt.
PROBE_SIZES = (1, 2, 4, 8, 16, 32)
PROBE_CACHE_LEN = 64
SPIKE_FACTOR = 1.3  # a probe this much slower than the next larger one is timed again
SPIKE_RETRIES = 2


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
        raised to the smaller sizes' level; ``measure_cost`` re-times spikes before this)."""
        grid = np.arange(max_nodes + 1, dtype=np.float64)
        curve = np.interp(grid, np.asarray(sizes, float), np.asarray(seconds, float))
        curve = np.maximum.accumulate(curve)
        curve[0] = curve[1]
        return cls(curve, skinny_sizes, steady)


def measure_cost(model: torch.nn.Module, sizes=PROBE_SIZES, cache_len: int = PROBE_CACHE_LEN, repeats: int = 1) -> VerifyCost:
    """Time tree forwards of ``sizes`` nodes after a ``cache_len``-token prompt (median of ``repeats``).

    Untimed forwards first take the first-forward set-up (one per matmul path); on a CPU each
    size is then timed without a warm-up of its own (a GPU warms each new shape once).

    Runs the same path as decoding (``TreeModel.score_trees`` with a chain
    tree and its 4D mask), so the curve includes the mask's cost. Where the
    model can use the skinny matmul, probed sizes in ``SKINNY_ROWS`` are timed
    both ways; the curve takes the faster, and ``skinny_sizes`` lists the
    sizes that take the kernel (each size follows the nearest probe at or below it).
    Sizes are probed in increasing order, and a kernel forward no slower than the slowest plain
    forward timed so far wins without a plain timing of its own: a forward over more tokens
    never runs faster (on AMD CPUs, where MKL is slow at few rows, this skips most plain probes).
    """
    from retrieval_draft.model.tree_model import TreeModel

    tree_model = TreeModel(model)
    rng = np.random.default_rng(0)
    tree_model.prefill(torch.from_numpy(rng.integers(0, model.config.vocab_size, size=(1, cache_len))))
    kernel_possible = bool(tree_model.skinny_sizes)
    warmups = 0 if tree_model.device.type == "cpu" else 1
    for path in ([frozenset(), frozenset([sizes[0]])] if kernel_possible else [frozenset()]):
        tree_model.skinny_sizes = path  # untimed: first-forward set-up, and the kernel's first call
        time_chain(tree_model, sizes[0], rng, repeats=1, warmups=0)  # (loading it, starting its threads)
    times, kernel_wins = [], {}
    plain_floor = 0.0  # the slowest plain forward timed so far: a larger plain one takes at least as long
    for size in sizes:
        competes = kernel_possible and size in SKINNY_ROWS
        if competes:
            tree_model.skinny_sizes = frozenset([size])
            kernel = time_chain(tree_model, size, rng, repeats, warmups)
            if kernel <= plain_floor:  # the kernel wins without timing the plain path (saves ~1 s on AMD CPUs)
                kernel_wins[size] = True
                times.append(kernel)
                continue
        tree_model.skinny_sizes = frozenset()
        plain = time_chain(tree_model, size, rng, repeats, warmups)
        plain_floor = max(plain_floor, plain)
        if competes:
            kernel_wins[size] = kernel < plain
        times.append(min(plain, kernel) if competes else plain)
    for _ in range(SPIKE_RETRIES):  # a size timed while other work held the cores: time it again
        spikes = spiked(times)
        if not spikes:
            break
        for i in spikes:
            tree_model.skinny_sizes = frozenset([sizes[i]]) if kernel_wins.get(sizes[i]) else frozenset()
            times[i] = min(times[i], time_chain(tree_model, sizes[i], rng, repeats, warmups))
    chosen = kernel_sizes(kernel_wins) if kernel_possible else None
    tree_model.skinny_sizes = chosen or frozenset()
    # One more forward of the first size, on its chosen path: far from the first timing means the
    # machine was busy meanwhile.
    settled = time_chain(tree_model, sizes[0], rng, repeats, warmups)
    steady = abs(settled - times[0]) <= 0.3 * times[0]
    return VerifyCost.from_points(sizes, times, max_nodes=max(sizes), skinny_sizes=chosen, steady=steady)


def spiked(times: list[float], factor: float = SPIKE_FACTOR) -> list[int]:
    """Indices of probe times more than ``factor`` times the next larger probe's: forwards over
    more tokens never run faster, so such a time is noise. Kept, one slow 2-node probe of
    Gemma-3-270M (903 ms, against 160 ms for one node) became a flat 903 ms from 2 to 64 nodes
    under the curve's running maximum, and the planner built almost no trees."""
    return [i for i in range(len(times) - 1) if times[i] > factor * times[i + 1]]


def kernel_sizes(kernel_wins: dict[int, bool]) -> frozenset:
    """Sizes in ``SKINNY_ROWS`` that take the kernel: those whose nearest probe at or below won."""
    chosen = set()
    for size in SKINNY_ROWS:
        below = [probe for probe in kernel_wins if probe <= size]
        if below and kernel_wins[max(below)]:
            chosen.add(size)
    return frozenset(chosen)


def time_chain(tree_model, size: int, rng: np.random.Generator, repeats: int, warmups: int = 1) -> float:
    """Median seconds of ``repeats`` forwards over a random ``size``-token chain, after ``warmups``
    untimed ones; the cache is trimmed back to one new row after each. Timed by ``ForwardTimer``
    (CUDA events on a GPU, where the clock around the call would only time the launch)."""
    from retrieval_draft.tree import DraftTree

    chain = DraftTree(
        tokens=rng.integers(0, tree_model.model.config.vocab_size, size=size),
        parents=np.arange(-1, size - 1),
        depths=np.arange(size),
        probs=np.ones(size),
    )
    timer = ForwardTimer(tree_model.device)
    samples = []
    for _ in range(warmups + repeats):
        timer.start()
        tree_model.score_trees([chain])
        timer.stop()
        samples.append(timer.seconds())
        tree_model.keep([np.zeros(1, dtype=np.int64)])
    return float(np.median(samples[warmups:]))


class ObservedCost:
    """Corrects a cost curve with the forward times decoding actually sees, by rows and cache length.

    A curve measured while the machine was busy (or on a persisted file from
    another day) can have the wrong shape, and the planner then picks trees
    that cost more than they return. And the curve is measured after a
    ``PROBE_CACHE_LEN``-token prompt of one row, while every tree node attends to the whole
    cache: after a 6k-token prompt each node costs more, and more so than a
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
