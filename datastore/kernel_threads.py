"""Run a Numba kernel's slices of work on Python threads, one slice per thread.

The builder's parallel kernels are plain ``nogil`` kernels over a half-open
range of their work items (``kernel(q0, q1, *args)``); ``on_threads`` calls one
per slice on its own thread, and the slices run in parallel because the
kernels release the GIL. Numba's ``parallel=True`` would do the same with
``prange`` but costs about 5 s more to compile the sort on 2 cores (the parfor
passes), paid by every fresh install's first build. The thread count is
Numba's (``numba.get_num_threads``: ``NUMBA_NUM_THREADS``, or
``numba.set_num_threads``), as it was under ``prange``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np


def even_slices(items: int, threads: int) -> np.ndarray:
    """(threads + 1,) int64 bounds cutting ``items`` work items into ``threads`` near-equal slices."""
    return (np.arange(threads + 1, dtype=np.int64) * items) // max(1, threads)


def on_threads(kernel: Callable, starts: np.ndarray, *args) -> None:
    """``kernel(starts[t], starts[t + 1], *args)`` for every slice t, each on its own thread
    (the caller's for a single slice). Each slice must write only its own outputs, so the
    result is the same for any thread count or timing."""
    slices = [(np.int64(starts[t]), np.int64(starts[t + 1])) for t in range(starts.size - 1)]
    if len(slices) == 1:
        kernel(*slices[0], *args)
        return
    with ThreadPoolExecutor(len(slices)) as pool:
        for done in [pool.submit(kernel, q0, q1, *args) for q0, q1 in slices]:
            done.result()
