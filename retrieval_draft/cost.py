"""What verifying a tree of n nodes costs on this machine, and which n pays best.

On a CPU one forward over 16 new tokens costs about two single-token
forwards, on a GPU hardly more than one; so the tree size that maximises
accepted tokens per second depends on the device. ``VerifyCost`` measures
the curve once per model and process (``CostCache`` keeps it), and
``best_size`` picks the number of draft nodes that maximises expected tokens
per second given the nodes' estimated acceptance probabilities. On CPU the
measurement also times each probed size of 4-16 nodes with and without the
skinny matmul (``skinny_linear.py``) and keeps, per size, whichever was faster.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from retrieval_draft.skinny_linear import SKINNY_ROWS

PROBE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
PROBE_CACHE_LEN = 256


@dataclass(frozen=True)
class VerifyCost:
    """Forward time by number of new tokens.

    Attributes:
        seconds: shape (max_nodes + 1,), float64; ``seconds[k]`` is the time of
            one forward over k new tokens (``seconds[0]`` unused, equal to ``seconds[1]``).
        skinny_sizes: tree sizes that should use the skinny matmul (``TreeModel(skinny_sizes=)``);
            None leaves ``TreeModel``'s default.
    """

    seconds: np.ndarray
    skinny_sizes: frozenset | None = None

    @property
    def max_nodes(self) -> int:
        return int(self.seconds.shape[0] - 1)

    @classmethod
    def from_points(cls, sizes, seconds, max_nodes: int = 64, skinny_sizes: frozenset | None = None) -> "VerifyCost":
        """Linear interpolation through measured (size, seconds) points, non-decreasing."""
        grid = np.arange(max_nodes + 1, dtype=np.float64)
        curve = np.interp(grid, np.asarray(sizes, float), np.asarray(seconds, float))
        curve = np.maximum.accumulate(curve)
        curve[0] = curve[1]
        return cls(curve, skinny_sizes)

    def best_size(self, probs: np.ndarray, overhead_s: float = 0.0) -> int:
        """How many draft nodes to verify.

        Args:
            probs: shape (m,), estimated acceptance probabilities of the candidate
                draft nodes, sorted in decreasing order (an ancestor-closed prefix
                for every length).
            overhead_s: fixed per-step time beside the forward (drafting, bookkeeping).

        Returns:
            n in [0, m]: expected tokens per step ``1 + sum(probs[:n])`` divided by
            ``seconds[n + 1] + overhead_s`` is largest there.
        """
        m = min(int(probs.shape[0]), self.max_nodes - 1)
        gain = 1.0 + np.concatenate([[0.0], np.cumsum(probs[:m])])
        rate = gain / (self.seconds[1 : m + 2] + overhead_s)
        return int(np.argmax(rate))


def measure_cost(model: torch.nn.Module, sizes=PROBE_SIZES, cache_len: int = PROBE_CACHE_LEN, repeats: int = 3) -> VerifyCost:
    """Time tree forwards of ``sizes`` nodes after a ``cache_len``-token prompt (median of ``repeats``).

    Runs the same path as decoding (``TreeModel.score_tree`` with a chain
    tree and its 4D mask), so the curve includes the mask's cost. Where the
    model can use the skinny matmul, probed sizes in ``SKINNY_ROWS`` are timed
    both ways; the curve takes the faster, and ``skinny_sizes`` lists the
    sizes that take the kernel (each size follows the nearest probe at or below it).
    """
    from retrieval_draft.model_adapter import TreeModel

    tree_model = TreeModel(model)
    rng = np.random.default_rng(0)
    tree_model.prefill(torch.from_numpy(rng.integers(0, model.config.vocab_size, size=(1, cache_len))))
    kernel_possible = bool(tree_model.skinny_sizes)
    times, kernel_wins = [], {}
    for size in sizes:
        tree_model.skinny_sizes = frozenset()
        best = time_chain(tree_model, size, rng, repeats)
        if kernel_possible and size in SKINNY_ROWS:
            tree_model.skinny_sizes = frozenset([size])
            kernel = time_chain(tree_model, size, rng, repeats)
            kernel_wins[size] = kernel < best
            best = min(best, kernel)
        times.append(best)
    chosen = kernel_sizes(kernel_wins) if kernel_possible else None
    return VerifyCost.from_points(sizes, times, max_nodes=max(sizes), skinny_sizes=chosen)


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
    untimed ones; the cache is trimmed back to one new row after each."""
    from retrieval_draft.tree import DraftTree

    chain = DraftTree(
        tokens=rng.integers(0, tree_model.model.config.vocab_size, size=size),
        parents=np.arange(-1, size - 1),
        depths=np.arange(size),
        probs=np.ones(size),
    )
    samples = []
    for _ in range(warmups + repeats):
        started = time.perf_counter()
        tree_model.score_tree(chain)
        if tree_model.device.type == "cuda":
            torch.cuda.synchronize(tree_model.device)
        samples.append(time.perf_counter() - started)
        tree_model.keep(np.zeros(1, dtype=np.int64))
    return float(np.median(samples[warmups:]))


class CostCache:
    """Measured cost curves, one per live model; measure once, reuse for every call."""

    def __init__(self) -> None:
        self._curves: "weakref.WeakKeyDictionary[torch.nn.Module, VerifyCost]" = weakref.WeakKeyDictionary()

    def get(self, model: torch.nn.Module) -> VerifyCost:
        curve = self._curves.get(model)
        if curve is None:
            curve = measure_cost(model)
            self._curves[model] = curve
        return curve
