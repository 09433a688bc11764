"""A float32 CPU matmul for the 1 to 64 rows of a decode or tree forward.

On this project's CPUs MKL multiplies one to three rows by a weight matrix
at memory speed, but from four rows on it switches to a blocked GEMM that
reads SmolLM2-135M's weights at about half that speed: a forward over 8 new
tokens spent 45 ms in ``aten::mm`` against 21 ms for 1 token. ``skinny_matmul``
streams each weight row once and multiplies it with every input row while
it sits in L1, split over threads by weight rows, 2 input rows by 4 weight
rows per inner loop (``_blocked``). Where it is faster on the machine
(``walks_faster``, measured with the cost curve: it was on a 2-core AMD EPYC,
it is not on a 2-core AVX-512 Xeon), up to ``ROW_BY_ROW`` input rows of at least
``ROW_BY_ROW_DEPTH`` values walk the weights one row after another instead
(``_row_by_row``: one sequential stream per thread, up to 4 input rows per pass).
``skinny_linears(skinny_forwards(linears))`` routes a
model's float32 ``nn.Linear`` layers through it for one forward on CPU; the sizes that
use it are measured per model with the cost curve (``VerifyCost.skinny_sizes``).

Results differ from MKL's by float32 rounding only (summation order); the
engine's outputs are still checked against HF greedy token for token.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from functools import partial
from typing import Callable

import numba
import numpy as np
import torch
from numba import njit, prange

# Tree sizes that may take the kernel (``cost.measure_cost`` times each probed size both ways and
# keeps the faster, per machine). On a 2-core AVX-512 Xeon, for SmolLM2-135M's 211 weight matrices:
# 1-3 rows MKL 21-23 ms, kernel 19-24 ms; 4 rows 36 vs 27 ms; 8 rows 45 vs 33 ms; 16 rows 51 vs 49 ms.
# On a 2-core AMD EPYC, whole forwards after 256 tokens (``tools.diagnostics.forward_cost``, 2026-11-24): 1 token
# MKL 63.7 ms, kernel 39.1 ms; 2 tokens 101.4 vs 45.4 ms; 3 tokens 128.6 vs 48.1 ms; 4 tokens 90.6 vs 48.5 ms;
# there (2026-11-26, ``measure_cost``) 32 tokens 285-326 vs 167-185 ms, 64 tokens 317-462 vs 264-293 ms.
SKINNY_ROWS = range(1, 65)
# Where walking row by row is faster on the machine (``walks_faster``), up to this many input rows the
# weights are walked row by row (``_row_by_row``), beyond it in blocks of 4 rows (``_blocked``). All of a
# model's weight matrices (scratch timings, the two alternated, ms, blocked / row by row): on a 2-core AMD
# EPYC (AVX2, 2026-11-28, medians) SmolLM2-135M's 211, 1 row 24.7 / 22.4, 2 rows 29.9 / 25.1, 4 rows
# 34.7 / 28.6, 8 rows 42.7 / 39.2, 16 rows 61.8 / 77.6 (a plain read of the same weights: 20 ms);
# Gemma-3-270M's 127, 1 row 42.7 / 37.4, 4 rows 61.7 / 53.6, 8 rows 76.5 / 74.9, 12 rows 98.0 / 111.2.
# On a 2-core AVX-512 Xeon (2026-11-28, the best of 14) the other way round: SmolLM2-135M's 211, 1 row
# 18.7 / 22.4, 2 rows 21.7 / 24.6, 4 rows 26.0 / 31.2, 8 rows 31.6 / 36.6.
ROW_BY_ROW = 8
# ... and when each weight row holds at least this many values: below it the row-by-row loop's set-up per
# weight row outweighs its reads (a 49,152 x 64 output layer, one thread, 1 input row: 0.97 ms row by row
# against 0.48 ms blocked; at 128 values 1.77 against 2.49 ms; scratch timings, 2026-11-28).
ROW_BY_ROW_DEPTH = 128


def skinny_matmul(x: np.ndarray, w: np.ndarray, out: np.ndarray, row_by_row: bool = False) -> None:
    """out[m, o] = sum_k x[m, k] * w[o, k], each output element summed on one thread.

    Args:
        x: (M, K) float32, C-contiguous.
        w: (N, K) float32, C-contiguous (an ``nn.Linear`` weight).
        out: (M, N) float32, written.
        row_by_row: walk the weights row by row where the input's shape allows (``ROW_BY_ROW``,
            ``ROW_BY_ROW_DEPTH``): the machine's choice, ``walks_faster``.
    """
    if row_by_row and x.shape[0] <= ROW_BY_ROW and x.shape[1] >= ROW_BY_ROW_DEPTH:
        _row_by_row(x, w, out)
    else:
        _blocked(x, w, out)


def walks_faster(linears: list[torch.nn.Linear], rows: tuple[int, ...] = (1, 4), rounds: int = 2) -> bool:
    """Whether walking the weights row by row beats the blocked loop on this machine: both loops
    multiply random inputs of each of ``rows`` by every weight of ``linears`` (from
    ``eligible_linears``; those ``_row_by_row`` would take), one pass over all of them per timing,
    as a forward streams them; ``rounds`` passes per loop and row count, the loops alternated, the
    fastest pass of each kept (other work only slows a pass). One-off, with the cost curve: about
    0.2 s for SmolLM2-135M's 211 matrices on a 2-core Xeon. The kernel runs on the threads
    ``skinny_linears`` gives it."""
    weights = [m.weight.detach().numpy() for m in linears if m.weight.shape[1] >= ROW_BY_ROW_DEPTH]
    if not weights:
        return False
    generator = np.random.default_rng(0)
    threads, most = _kernel_threads()
    numba.set_num_threads(most)
    try:
        spent = {True: 0.0, False: 0.0}
        for count in rows:
            inputs = [generator.standard_normal((count, w.shape[1]), dtype=np.float32) for w in weights]
            outputs = [np.empty((count, w.shape[0]), np.float32) for w in weights]
            for loop in (_row_by_row, _blocked):  # loaded (or compiled) untimed
                loop(inputs[0], weights[0], outputs[0])
            best = {True: np.inf, False: np.inf}
            for turn in range(2 * rounds):
                walk = (turn + count) % 2 == 0  # the loops take turns, the first alternating by row count
                started = time.perf_counter()
                for x, w, out in zip(inputs, weights, outputs):
                    (_row_by_row if walk else _blocked)(x, w, out)
                best[walk] = min(best[walk], time.perf_counter() - started)
            for walk in best:
                spent[walk] += best[walk]
        return spent[True] < spent[False]
    finally:
        numba.set_num_threads(threads)


@njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def _row_by_row(x, w, out):  # pragma: no cover - compiled
    """``skinny_matmul`` for a few input rows: each weight row is read once, in order, and multiplied
    with 4, 3, 2 or 1 input rows per pass while it sits in L1."""
    rows, depth = x.shape
    for o in prange(w.shape[0]):
        m = 0
        while m + 4 <= rows:
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for k in range(depth):
                wk = w[o, k]
                a0 += x[m, k] * wk
                a1 += x[m + 1, k] * wk
                a2 += x[m + 2, k] * wk
                a3 += x[m + 3, k] * wk
            out[m, o] = a0
            out[m + 1, o] = a1
            out[m + 2, o] = a2
            out[m + 3, o] = a3
            m += 4
        if m + 3 == rows:
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            for k in range(depth):
                wk = w[o, k]
                a0 += x[m, k] * wk
                a1 += x[m + 1, k] * wk
                a2 += x[m + 2, k] * wk
            out[m, o] = a0
            out[m + 1, o] = a1
            out[m + 2, o] = a2
            m += 3
        if m + 2 <= rows:
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            for k in range(depth):
                wk = w[o, k]
                a0 += x[m, k] * wk
                a1 += x[m + 1, k] * wk
            out[m, o] = a0
            out[m + 1, o] = a1
            m += 2
        if m < rows:
            a0 = np.float32(0.0)
            for k in range(depth):
                a0 += x[m, k] * w[o, k]
            out[m, o] = a0


@njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def _blocked(x, w, out):  # pragma: no cover - compiled
    """``skinny_matmul`` for more input rows: 2 input rows by 4 weight rows per inner loop."""
    rows, depth = x.shape
    width = w.shape[0]
    blocks = (width + 3) // 4
    for block in prange(blocks):
        o = block * 4
        if o + 4 <= width:
            m = 0
            while m + 2 <= rows:
                a00 = np.float32(0.0)
                a01 = np.float32(0.0)
                a02 = np.float32(0.0)
                a03 = np.float32(0.0)
                a10 = np.float32(0.0)
                a11 = np.float32(0.0)
                a12 = np.float32(0.0)
                a13 = np.float32(0.0)
                for k in range(depth):
                    x0 = x[m, k]
                    x1 = x[m + 1, k]
                    w0 = w[o, k]
                    w1 = w[o + 1, k]
                    w2 = w[o + 2, k]
                    w3 = w[o + 3, k]
                    a00 += x0 * w0
                    a01 += x0 * w1
                    a02 += x0 * w2
                    a03 += x0 * w3
                    a10 += x1 * w0
                    a11 += x1 * w1
                    a12 += x1 * w2
                    a13 += x1 * w3
                out[m, o] = a00
                out[m, o + 1] = a01
                out[m, o + 2] = a02
                out[m, o + 3] = a03
                out[m + 1, o] = a10
                out[m + 1, o + 1] = a11
                out[m + 1, o + 2] = a12
                out[m + 1, o + 3] = a13
                m += 2
            if m < rows:
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                a2 = np.float32(0.0)
                a3 = np.float32(0.0)
                for k in range(depth):
                    xv = x[m, k]
                    a0 += xv * w[o, k]
                    a1 += xv * w[o + 1, k]
                    a2 += xv * w[o + 2, k]
                    a3 += xv * w[o + 3, k]
                out[m, o] = a0
                out[m, o + 1] = a1
                out[m, o + 2] = a2
                out[m, o + 3] = a3
        else:
            for oo in range(o, width):
                for m in range(rows):
                    acc = np.float32(0.0)
                    for k in range(depth):
                        acc += x[m, k] * w[oo, k]
                    out[m, oo] = acc


def skinny_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` through ``skinny_matmul``; x is (..., K) float32 on CPU, returns (..., N)."""
    return _linear_forward(module.weight.detach().numpy(), module.bias, False, x)


def _linear_forward(weight: np.ndarray, bias: torch.Tensor | None, row_by_row: bool, x: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T + bias`` through ``skinny_matmul`` (``row_by_row`` passed on): x is (..., K)
    float32 on CPU, weight (N, K) float32 C-contiguous; returns (..., N).

    A forward makes one call per linear layer (211 for SmolLM2-135M), so the
    wrapping stays in numpy: reshaping and allocating through torch cost about
    three times the kernel's own call overhead at one row.
    """
    rows = x.detach().numpy()
    width = weight.shape[0]
    out = np.empty(rows.shape[:-1] + (width,), dtype=np.float32)
    skinny_matmul(np.ascontiguousarray(rows.reshape(-1, rows.shape[-1])), weight, out.reshape(-1, width), row_by_row)
    result = torch.from_numpy(out)
    if bias is not None:
        result += bias.detach()
    return result


def eligible_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's plain float32 CPU ``nn.Linear`` layers with C-contiguous weights.

    Subclasses (quantised layers and the like) and layers whose ``forward`` is
    already replaced on the instance (accelerate's offloading hooks) are left out.
    """
    found = []
    for module in model.modules():
        if type(module) is torch.nn.Linear and "forward" not in vars(module):
            weight = module.weight
            if weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.is_contiguous():
                found.append(module)
    return found


def skinny_forwards(linears: list[torch.nn.Linear], row_by_row: bool = False) -> list[tuple[torch.nn.Linear, Callable]]:
    """Each of ``linears`` (from ``eligible_linears``) with its forward through ``skinny_matmul``
    (walking the weights row by row for few rows where ``row_by_row``), built once (a tree model
    holds them for its generation) and switched on by ``skinny_linears``."""
    return [(module, partial(_linear_forward, module.weight.detach().numpy(), module.bias, row_by_row))
            for module in linears]


def _kernel_threads() -> tuple[int, int]:
    """(Numba's thread count now, to restore; the kernel's threads: torch's count, at most Numba's pool)."""
    torch_threads = torch.get_num_threads()
    threads = numba.get_num_threads()
    if torch.get_num_threads() != torch_threads:
        # Numba's first thread query starts its OpenMP pool, which can set OpenMP's thread count for
        # this thread to every core: seen with OMP_NUM_THREADS=1 and torch at 1 thread, torch then ran
        # 2 threads for the rest of the process. The caller's torch setting stands.
        torch.set_num_threads(torch_threads)
    return threads, max(1, min(torch_threads, numba.config.NUMBA_NUM_THREADS))


class KernelThreads:
    """How many threads the kernel runs on through one generation: torch's count, backing off to one
    while the process's threads do not get their cores.

    On a busy machine (other processes wanting every core) a thread of the kernel's is often
    descheduled, and the others wait for it at the end of each of a forward's 211 parallel loops:
    beside two CPU-bound processes on 2 cores, a step of ours (2.08 tokens) took 594 ms against plain
    ``generate``'s 227 ms per token (2026-11-27, ``retrieval-draft generate --compare``). A forward whose process got less than ``BUSY`` of its threads' time
    (CPU seconds over wall seconds, ~1.98 of 2 on the quiet machine, ~0.96 beside two busy
    processes) sends the next ``RETRY`` forwards to one thread, which waits for no one; then
    ``threads`` is tried again. A generation's first forward is not judged: in a new process it
    loads the kernel from Numba's cache on one thread (0.1 s on a 2-core Xeon), which looked like
    contention and sent the next 16 forwards of every fresh process's first call to one thread
    (51 ms a step instead of 31 for SmolLM2-135M there)."""

    BUSY = 0.75
    RETRY = 16

    def __init__(self) -> None:
        self.single_left = 0  # forwards still to run on one thread
        self.judged = False  # whether a forward was observed yet (the first is not judged)

    def count(self, most: int) -> int:
        """Threads for the next forward, ``most`` at most."""
        return 1 if self.single_left > 0 else most

    def observe(self, threads: int, wall_s: float, cpu_s: float) -> None:
        """A forward ran on ``threads`` threads for ``wall_s`` seconds, the process using ``cpu_s`` CPU seconds."""
        if not self.judged:
            self.judged = True
            return
        if threads > 1 and cpu_s < self.BUSY * threads * wall_s:
            self.single_left = self.RETRY
        elif threads == 1 and self.single_left > 0:
            self.single_left -= 1


@contextmanager
def skinny_linears(forwards: list[tuple[torch.nn.Linear, Callable]], pacing: KernelThreads | None = None):
    """Within the block, the layers of ``forwards`` (from ``skinny_forwards``) compute through
    ``skinny_matmul``.

    The kernel runs on as many threads as torch is set to use (``torch.set_num_threads``), or one
    while ``pacing`` says the machine is busy (the block is timed for it), and torch's own setting is
    left as the caller made it.
    """
    if not forwards:  # the common case in the decode loop: nothing to switch
        yield
        return
    threads, most = _kernel_threads()
    running = pacing.count(most) if pacing is not None else most
    numba.set_num_threads(running)
    # Written to the instances' __dict__: nn.Module.__setattr__ costs several times more, per layer and forward.
    for module, forward in forwards:
        module.__dict__["forward"] = forward
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        if pacing is not None:
            pacing.observe(running, time.perf_counter() - wall, time.process_time() - cpu)
        for module, _ in forwards:
            del module.__dict__["forward"]
        numba.set_num_threads(threads)
