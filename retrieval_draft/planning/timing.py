"""Wall time of one forward, on whatever device runs it.

On CPU a forward has finished when the call returns, so ``perf_counter``
around it is its time. On a GPU the call only queues kernels: the clock
would read the launch, not the work. ``ForwardTimer`` records CUDA events
around the call there and reads their interval later (in the decode loop,
after the step's one host read has waited for the stream anyway, so the
read costs no extra wait). Other accelerators are bracketed by
``torch.accelerator.synchronize``.
"""

from __future__ import annotations

import time

import torch

HOST_CLOCK, CUDA_EVENTS, SYNCHRONIZED = "host_clock", "cuda_events", "synchronized"


def timing_mode(device: torch.device) -> str:
    """How forwards on ``device`` are timed: ``HOST_CLOCK`` (CPU), ``CUDA_EVENTS`` or ``SYNCHRONIZED``."""
    if device.type == "cpu":
        return HOST_CLOCK
    if device.type == "cuda":
        return CUDA_EVENTS
    return SYNCHRONIZED


def synchronize(device: torch.device) -> None:
    """Wait until ``device`` has finished its queued work (nothing to wait for on a CPU)."""
    mode = timing_mode(torch.device(device))
    if mode == CUDA_EVENTS:
        torch.cuda.synchronize(device)
    elif mode == SYNCHRONIZED:
        torch.accelerator.synchronize(device)


class ForwardTimer:
    """``start()``, launch the forward, ``stop()``; ``seconds()`` then gives its duration.

    One timer per decode loop; its two CUDA events are reused every step.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.mode = timing_mode(self.device)
        self._events = None
        if self.mode == CUDA_EVENTS:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        self._marks = [0.0, 0.0]  # host clock at start and stop

    def start(self) -> None:
        self._mark(0)

    def stop(self) -> None:
        self._mark(1)

    def _mark(self, end: int) -> None:
        """Record the interval's start (``end`` 0) or stop (1): a CUDA event, or the host clock
        (after a synchronise where the device has no events)."""
        if self.mode == CUDA_EVENTS:
            self._events[end].record(torch.cuda.current_stream(self.device))
            return
        if self.mode == SYNCHRONIZED:
            synchronize(self.device)
        self._marks[end] = time.perf_counter()

    def seconds(self) -> float:
        """The last start-stop interval in seconds; on CUDA waits for the stop event if it is pending."""
        if self.mode == CUDA_EVENTS:
            self._events[1].synchronize()
            return self._events[0].elapsed_time(self._events[1]) / 1000.0
        return self._marks[1] - self._marks[0]
