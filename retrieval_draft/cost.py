"""What verifying a tree of n nodes costs on this machine, and which n pays best.

On a CPU one forward over 16 new tokens costs about two single-token
forwards, on a GPU hardly more than one; so the tree size that maximises
accepted tokens per second depends on the device. ``VerifyCost`` measures
the curve once per model and process (``cost_for`` caches it), and
``best_size`` picks the number of draft nodes that maximises expected tokens
per second given the nodes' estimated acceptance probabilities.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np
import torch

PROBE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
PROBE_CACHE_LEN = 256


@dataclass(frozen=True)
class VerifyCost:
    """Forward time by number of new tokens.

    Attributes:
        seconds: shape (max_nodes + 1,), float64; ``seconds[k]`` is the time of
            one forward over k new tokens (``seconds[0]`` unused, equal to ``seconds[1]``).
    """

    seconds: np.ndarray

    @property
    def max_nodes(self) -> int:
        return int(self.seconds.shape[0] - 1)

    @classmethod
    def from_points(cls, sizes, seconds, max_nodes: int = 64) -> "VerifyCost":
        """Linear interpolation through measured (size, seconds) points, non-decreasing."""
        grid = np.arange(max_nodes + 1, dtype=np.float64)
        curve = np.interp(grid, np.asarray(sizes, float), np.asarray(seconds, float))
        curve = np.maximum.accumulate(curve)
        curve[0] = curve[1]
        return cls(curve)

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
    tree and its 4D mask), so the curve includes the mask's cost.
    """
    from retrieval_draft.model_adapter import TreeModel
    from retrieval_draft.tree import DraftTree

    tree_model = TreeModel(model)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    tree_model.prefill(torch.from_numpy(rng.integers(0, vocab, size=(1, cache_len))))
    times = []
    for size in sizes:
        chain = DraftTree(
            tokens=rng.integers(0, vocab, size=size),
            parents=np.arange(-1, size - 1),
            depths=np.arange(size),
            probs=np.ones(size),
        )
        samples = []
        for _ in range(repeats + 1):  # the first run warms up
            started = time.perf_counter()
            tree_model.score_tree(chain)
            if tree_model.device.type == "cuda":
                torch.cuda.synchronize(tree_model.device)
            samples.append(time.perf_counter() - started)
            tree_model.keep(np.zeros(1, dtype=np.int64))
        times.append(float(np.median(samples[1:])))
    return VerifyCost.from_points(sizes, times, max_nodes=max(sizes))


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
