"""Measuring the forward-cost curve: which forwards to time, and the curve they give.

``CostProbe`` is the schedule of one measurement. Per probed size (``PROBE_SIZES``, in
increasing order) it wants one timed forward through the skinny matmul where the kernel
competes (``SKINNY_ROWS``) and one through the plain path, unless the kernel's time is at or
below the slowest plain forward timed at a smaller size (a forward over more tokens never runs
faster, so plain has lost untimed: on AMD CPUs, where MKL is slow at few rows, this skips most
plain probes). Then a probe far slower than the next larger one is timed again (``spiked``), and
a closing forward of the first size says whether the machine stayed steady. The kernel's first
forward (loading it, starting its threads) and, on a GPU, the first forward of each size are run
untimed.

Every size above one token is timed beside a lone root: a ``REF`` forward of one token runs just
before that size's forwards, and the size is kept as its ratio to that lone root. The curve is
those ratios times the fastest lone root the measurement ran, so a spell of other work
that slows a size and its lone root alike leaves the curve's shape as it was (a spell that
slowed only the 3-16-token probes once left a curve pricing 3 tokens at 11.6 lone roots, and a
planner that believed it never verified a tree again).

Two drivers feed it:

- decoding itself: the first single-row call of a process with no stored curve verifies real
  trees of the probed sizes (``TreePlanner(probe=)``), so the measurement's forwards accept
  tokens too, instead of a separate measurement before decoding (``measure_cost``: 1.4-2.1 s for
  SmolLM2-135M on a 2-core AMD EPYC, 2026-11-26, against about one decode step per probe);
- ``measure_cost``: forwards over random chains after a ``PROBE_CACHE_LEN``-token prompt, for a
  call that cannot probe while it decodes (a batch of rows, or a model verified as chains).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from retrieval_draft.model.skinny_linear import SKINNY_ROWS, eligible_linears, walks_faster
from retrieval_draft.planning.cost import VerifyCost
from retrieval_draft.planning.timing import ForwardTimer

# Probed tree sizes: sizes between probes are interpolated, larger ones extrapolated
# (``sizer.extended_cost``), and ``ObservedCost`` corrects the curve from the forwards decoding
# times, per band of cache length too.
PROBE_SIZES = (1, 2, 4, 8, 16, 32)
PROBE_CACHE_LEN = 64  # ``measure_cost``'s prompt, in tokens
SPIKE_FACTOR = 1.3  # a probe this much slower than the next larger one is timed again
SPIKE_RETRIES = 2  # times one size is timed again at most

SETUP, TIME, AGAIN, SETTLE, REF = "setup", "time", "again", "settle", "ref"


@dataclass(frozen=True)
class Probe:
    """One forward a measurement wants.

    Attributes:
        tokens: new tokens in the forward (one row's tree size).
        kernel: through the skinny matmul (else the plain path).
        role: ``SETUP`` (run, not recorded), ``TIME`` (a first timing), ``AGAIN`` (a spike
            timed again), ``REF`` (a lone root timed just before the forwards of size ``serves``)
            or ``SETTLE`` (the closing forward).
        serves: for ``REF``, the size whose forwards it is the lone root beside; else 0.
    """

    tokens: int
    kernel: bool
    role: str
    serves: int = 0

    @property
    def matmul_sizes(self) -> frozenset:
        """``TreeModel.skinny_sizes`` for this forward: its size through the kernel or not."""
        return frozenset([self.tokens]) if self.kernel else frozenset()


class CostProbe:
    """The forwards one cost measurement still wants, and the curve from those it has timed.

    Args:
        sizes: tree sizes to probe, in tokens (the first is the lone root, normally 1).
        kernel_possible: the model can take the skinny matmul (float32 on CPU).
        setup_each_size: run each size once untimed first (a GPU's first forward of a shape).
        row_by_row: the kernel's loop on this machine (``skinny_linear.walks_faster``), which
            the timed forwards run and the curve keeps.
    """

    def __init__(self, sizes=PROBE_SIZES, kernel_possible: bool = False, setup_each_size: bool = False,
                 row_by_row: bool = False) -> None:
        self.sizes = tuple(sorted(set(int(s) for s in sizes)))
        self.kernel_possible = kernel_possible
        self.setup_each_size = setup_each_size
        self.row_by_row = row_by_row
        # first size: seconds; larger sizes: seconds over the lone root timed just before them
        self.kernel: dict[int, float] = {}  # through the skinny matmul
        self.plain: dict[int, float] = {}  # through the plain path
        self.lone_roots: list[float] = []  # seconds of every REF forward
        self.settled: float | None = None
        self._set_up: set = set()
        self._again: dict[int, int] = {}
        self._ref: tuple[int, float] | None = None  # (size served, seconds) of the last REF, until used up

    def _competes(self, size: int) -> bool:
        return self.kernel_possible and size in SKINNY_ROWS

    def _value(self, size: int, measured: float) -> float:
        """A recorded time of ``size`` in seconds (a ratio times the median lone root above the first size)."""
        return measured if size == self.sizes[0] else measured * self.lone_root()

    def lone_root(self) -> float:
        """The fewest seconds of any lone root timed so far (the first size's faster path and the REFs):
        a forward cannot run faster than the idle machine allows, so the least is the idle one."""
        first = self.sizes[0]
        timed = [*self.lone_roots]
        if self._timed(first):
            timed.append(self.kernel[first] if self.kernel_wins(first) else self.plain[first])
        return float(min(timed)) if timed else 0.0

    def _plain_lost(self, size: int) -> bool:
        """Whether the kernel's time at ``size`` is at or below every plain time at smaller sizes."""
        if not (self._competes(size) and size in self.kernel):
            return False
        floor = max((self._value(s, t) for s, t in self.plain.items() if s < size), default=0.0)
        return self._value(size, self.kernel[size]) <= floor

    def _timed(self, size: int) -> bool:
        """Whether ``size`` has every first timing it needs."""
        if self._competes(size) and size not in self.kernel:
            return False
        return size in self.plain or self._plain_lost(size)

    def kernel_wins(self, size: int) -> bool:
        """Whether a timed ``size`` takes the skinny matmul."""
        return self._competes(size) and (size not in self.plain or self.kernel[size] < self.plain[size])

    def _times(self) -> tuple[list[int], list[float]]:
        """The sizes timed so far (an increasing prefix of ``sizes``) and their faster path's seconds."""
        done = []
        for size in self.sizes:
            if not self._timed(size):
                break
            done.append(size)
        values = [self._value(s, self.kernel[s] if self.kernel_wins(s) else self.plain[s]) for s in done]
        if done:
            values[0] = self.lone_root()
        return done, values

    def pending(self) -> Probe | None:
        """The next forward to run, or None when the measurement is complete."""
        wanted = self._next()
        if wanted is None or wanted.role not in (TIME, AGAIN) or wanted.tokens == self.sizes[0]:
            return wanted
        if self._ref is None or self._ref[0] != wanted.tokens:
            first = self.sizes[0]
            return Probe(first, self.kernel_wins(first), REF, serves=wanted.tokens)
        return wanted

    def _next(self) -> Probe | None:
        """The next forward other than a lone root beside it."""
        if self.kernel_possible and not self.setup_each_size and "kernel" not in self._set_up:
            return Probe(self.sizes[0], True, SETUP)
        for size in self.sizes:
            if self.setup_each_size and size not in self._set_up:
                return Probe(size, False, SETUP)
            if self._competes(size) and size not in self.kernel:
                return Probe(size, True, TIME)
            if not self._timed(size):
                return Probe(size, False, TIME)
        done, times = self._times()
        for index in spiked(times):
            if self._again.get(done[index], 0) < SPIKE_RETRIES:
                return Probe(done[index], self.kernel_wins(done[index]), AGAIN)
        if self.settled is None:
            return Probe(self.sizes[0], self.kernel_wins(self.sizes[0]), SETTLE)
        return None

    @property
    def complete(self) -> bool:
        return self.pending() is None

    def record(self, probe: Probe, seconds: float) -> None:
        """``probe`` (from ``pending``) took ``seconds``."""
        if probe.role == SETUP:
            self._set_up.add(probe.tokens if self.setup_each_size else "kernel")
            return
        if probe.role == SETTLE:
            self.settled = seconds
            return
        if probe.role == REF:
            self.lone_roots.append(seconds)
            self._ref = (probe.serves, seconds)
            return
        if probe.tokens != self.sizes[0]:  # kept as a ratio to the lone root beside it
            beside = self._ref[1] if self._ref is not None and self._ref[0] == probe.tokens else self.lone_root()
            seconds = seconds / beside
        times = self.kernel if probe.kernel else self.plain
        if probe.role == AGAIN:
            self._again[probe.tokens] = self._again.get(probe.tokens, 0) + 1
            seconds = min(seconds, times.get(probe.tokens, seconds))
            self._ref = None  # each timing again gets a lone root of its own
        times[probe.tokens] = seconds

    def curve(self) -> VerifyCost | None:
        """The curve from the sizes timed so far (up to the largest of them; None before the
        first), with the sizes that take the kernel; ``steady`` False when the closing forward
        differed from the first timing by more than 30%."""
        done, times = self._times()
        if not done:
            return None
        first = self.sizes[0]
        measured = self.kernel[first] if self.kernel_wins(first) else self.plain[first]
        steady = self.settled is None or abs(self.settled - measured) <= 0.3 * measured
        wins = {s: self.kernel_wins(s) for s in done if self._competes(s)}
        chosen = kernel_sizes(wins) if self.kernel_possible else None
        return VerifyCost.from_points(done, times, max_nodes=done[-1], skinny_sizes=chosen, steady=steady,
                                      row_by_row=self.row_by_row)


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


def new_probe(model: torch.nn.Module, sizes=PROBE_SIZES) -> CostProbe:
    """A measurement for ``model``: the kernel competes where it is float32 on a CPU, in the loop
    faster on this machine (``walks_faster``, timed now over the model's weights), and a GPU runs
    each size once untimed first."""
    device = next(model.parameters()).device
    linears = eligible_linears(model)
    return CostProbe(sizes, kernel_possible=bool(linears), setup_each_size=device.type != "cpu",
                     row_by_row=bool(linears) and walks_faster(linears))


def measure_cost(
    model: torch.nn.Module, sizes=PROBE_SIZES, cache_len: int = PROBE_CACHE_LEN, repeats: int = 1,
    probe: CostProbe | None = None,
) -> VerifyCost:
    """Run the forwards ``probe`` (default: a new one over ``sizes``) still wants over random
    chains after a ``cache_len``-token prompt (each timed as the median of ``repeats``), and
    return its curve.

    Runs the same path as decoding (``TreeModel.score_trees`` with a chain tree and its 4D
    mask), so the curve includes the mask's cost.
    """
    from retrieval_draft.model.tree_model import TreeModel

    probe = probe if probe is not None else new_probe(model, sizes)
    tree_model = TreeModel(model)
    tree_model.row_by_row = probe.row_by_row
    rng = np.random.default_rng(0)
    tree_model.prefill(torch.from_numpy(rng.integers(0, model.config.vocab_size, size=(1, cache_len))))
    while (wanted := probe.pending()) is not None:
        tree_model.skinny_sizes = wanted.matmul_sizes
        probe.record(wanted, time_chain(tree_model, wanted.tokens, rng, 1 if wanted.role == SETUP else repeats, 0))
    return probe.curve()


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
