"""Stand-in clocks for tests of tools that time things: a test reads the tool's arithmetic against
known times instead of bounding this machine's speed."""

from __future__ import annotations

from types import SimpleNamespace


def stepping_clock(step: float) -> SimpleNamespace:
    """A stand-in for a module's ``time``: each ``perf_counter()`` read is ``step`` seconds after
    the one before, so an interval between two consecutive reads is exactly ``step`` (take a power
    of two, such as 0.25, so that the subtraction is exact in floating point)."""
    reads = iter(range(10**9))
    return SimpleNamespace(perf_counter=lambda: next(reads) * step)


class FixedTimer:
    """A stand-in for ``ForwardTimer``: every forward it times took ``SECONDS``."""

    SECONDS = 0.125

    def __init__(self, device) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def seconds(self) -> float:
        return self.SECONDS
