"""What a serving engine's step costs against the draft tokens it verifies, learned from the engine's own pace.

A proposer is called once per engine step, so the time from the end of one call to the start of
the next is the engine's step: its forward over every row's new token and the draft tokens sent
at the first call, sampling and scheduling (the proposer's own time excluded). ``StepClock`` takes
those samples (only between two calls over the same requests, all decoding: a step that
prefilled a prompt or started or ended a request says nothing of drafts), and ``StepCost`` fits

    seconds = plain + overhead * [any draft sent] + per_token * (draft tokens sent)

by exponentially weighted least squares (recent steps count most: the context grows and requests
come and go), leaning on a prior shape (overhead and per-token cost as fractions of a plain step,
``StepCost.prior``) with a few pseudo-steps of weight, so the fit is sane before the engine has
shown every kind of step and where it never will (a proposer that never drafts never learns what
drafting costs; the prior says). ``choose_lengths`` then cuts each request's chain where the
expected tokens per second of the whole step peak.

No engine imported (numpy, and the engine's own rank correction).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from retrieval_draft.planning.calibration import RankCorrection


@dataclass(frozen=True)
class CostShape:
    """A speculative step's cost in plain steps: ``overhead`` for sending any draft at all (the
    rejection sampler, the bookkeeping of a speculative step), ``per_token`` for each draft token
    verified. The defaults: vLLM 0.32 on a 2-core AMD EPYC, SmolLM2-135M, one request
    (measured by a proposer sending junk drafts of 0-8 tokens in turn, ``git show 04619d4:tools/vllm_step_cost.py``:
    84-89 ms a plain step; each draft token 6-9 ms, the overhead 0-4 ms)."""

    overhead: float = 0.03
    per_token: float = 0.08


class StepCost:
    """Step seconds against draft tokens sent, fitted online (module docstring).

    Args:
        prior: the shape believed before any step is seen.
        prior_weight: pseudo-steps behind the prior, at no draft, one draft token and ``prior_span`` tokens.
        prior_span: the longest draft of the prior's pseudo-steps (the proposer's chain limit).
        decay: weight of the past per sample (0.98: the last ~50 steps count).
    """

    def __init__(self, prior: CostShape = CostShape(), prior_weight: float = 1.0, prior_span: int = 8,
                 decay: float = 0.98) -> None:
        self.prior = prior
        self.decay = decay
        points = np.array([0, 1, max(prior_span, 2)], dtype=np.float64)
        self._prior_x = np.stack([np.ones(3), (points > 0).astype(np.float64), points], axis=1)  # (3, 3)
        self._prior_shape = self._prior_x @ np.array([1.0, prior.overhead, prior.per_token])  # in plain steps
        self._prior_weight = prior_weight
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self._weight = 0.0  # decayed count of samples
        self._seconds = 0.0  # decayed sum of step seconds
        self._shape = 0.0  # decayed sum of the prior's shape at each sample's draft length

    @property
    def samples(self) -> float:
        """Decayed count of the steps seen."""
        return self._weight

    def observe(self, seconds: float, draft_tokens: int) -> None:
        """One engine step of ``seconds`` that verified ``draft_tokens`` draft tokens (all rows)."""
        x = np.array([1.0, float(draft_tokens > 0), float(draft_tokens)])
        self._xtx = self.decay * self._xtx + np.outer(x, x)
        self._xty = self.decay * self._xty + x * seconds
        self._weight = self.decay * self._weight + 1.0
        self._seconds = self.decay * self._seconds + seconds
        self._shape = self.decay * self._shape + float(x @ np.array([1.0, self.prior.overhead, self.prior.per_token]))

    def coefficients(self) -> tuple[float, float, float]:
        """(plain, overhead, per_token) in seconds; before any sample, the prior in plain steps
        (plain = 1). Overhead and per-token cost are kept >= 0 and plain > 0."""
        if self._weight == 0.0:
            return 1.0, self.prior.overhead, self.prior.per_token
        scale = self._seconds / self._shape  # the plain step that fits the samples with the prior's shape
        w = self._prior_weight
        xtx = self._xtx + w * self._prior_x.T @ self._prior_x
        xty = self._xty + w * self._prior_x.T @ (scale * self._prior_shape)
        plain, overhead, per_token = np.linalg.solve(xtx, xty)
        plain = max(float(plain), 1e-3 * scale)
        return plain, max(float(overhead), 0.0), max(float(per_token), 0.0)

    def relative(self) -> CostShape:
        """The fitted overhead and per-token cost in plain steps."""
        plain, overhead, per_token = self.coefficients()
        return CostShape(overhead / plain, per_token / plain)


class StepClock:
    """Samples of the engine's step time: ``start`` when a proposer call starts, ``sample`` once the
    call knows whether it continues exactly the requests of the last call, ``sent`` when it ends.

    A sample is the time from the end of one call to the start of the next, with the draft tokens
    sent at the first; taken only when the second call continues exactly the requests of the first
    (``steady``: same rows, every row decoding, none new, none gone)."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.clock = clock
        self._started = 0.0
        self._ended: float | None = None
        self._rows = -1
        self._draft_tokens = 0

    def start(self) -> None:
        """A call starts."""
        self._started = self.clock()

    def sample(self, rows: int, gained: Sequence[int], steady: bool = True) -> tuple[float, int] | None:
        """(seconds of the step just run, draft tokens it verified), or None when the step is no
        clean sample (``rows`` changed, a row gained nothing, not ``steady``, no call before)."""
        ended, self._ended = self._ended, None
        if ended is None or not steady or rows != self._rows or rows == 0 or min(gained, default=0) == 0:
            return None
        return self._started - ended, self._draft_tokens

    def sent(self, rows: int, draft_tokens: int) -> None:
        """A call ends: it served ``rows`` rows and sent ``draft_tokens`` draft tokens in all."""
        self._ended = self.clock()
        self._rows = rows
        self._draft_tokens = draft_tokens


def choose_lengths(expected: Sequence[np.ndarray], shape: CostShape, iterations: int = 8) -> list[int]:
    """How many tokens of each request's chain to send so that the step's expected tokens per unit
    of cost peak.

    Args:
        expected: per request, the path probabilities of its chain's tokens in order (shape (m_r,);
            the chance each token and all before it are accepted); a request gains 1 + the sum of
            the first n_r of them (the bonus token included).
        shape: the step's cost in plain steps: 1 + ``overhead`` if any request drafts +
            ``per_token`` per draft token.

    Returns:
        n_r per request (0: send nothing). Found by Dinkelbach's iteration on the ratio
        (B + sum of expected gains) / cost: at a ratio r each request keeps the prefix that
        maximises its expected gain minus r * per_token per token; the ratio is then that choice's,
        and the loop stops when it no longer rises (a handful of rounds). Sending nothing at all
        (ratio B) is the fallback, so a weak draft is not sent.
    """
    gains = [np.concatenate([[0.0], np.cumsum(np.asarray(p, dtype=np.float64))]) for p in expected]
    rows = len(gains)
    if rows == 0:
        return []
    best_lengths, best_ratio = [0] * rows, float(rows)  # nothing sent: B tokens for one plain step
    ratio = best_ratio
    for _ in range(iterations):
        lengths = [int(np.argmax(g - ratio * shape.per_token * np.arange(g.shape[0]))) for g in gains]
        total = sum(lengths)
        if total == 0:
            break
        value = rows + sum(float(g[n]) for g, n in zip(gains, lengths))
        new_ratio = value / (1.0 + shape.overhead + shape.per_token * total)
        if new_ratio <= ratio + 1e-12:
            break
        ratio = new_ratio
        if ratio > best_ratio:
            best_lengths, best_ratio = lengths, ratio
    return best_lengths


CHAIN_BANDS = np.array([1, 2, 3, 5, 9])  # band b holds chain positions (1 = the first token sent) in [CHAIN_BANDS[b], CHAIN_BANDS[b + 1])


class ChainCorrection:
    """What the chains sent delivered against the path probabilities they were chosen by.

    A chain is the best of many drafters' alternatives, each probability an estimate; the best of
    several estimates is biased high (the winner's curse), the more so the more drafters compete
    (a corpus store's drafts beside prompt lookup's). Per band of chain positions ``ranks`` (a
    ``RankCorrection``, the engine's correction of a tree's ranks, here over a chain's positions)
    keeps decayed sums of the probability the sent tokens were given and of the tokens accepted,
    and ``scale`` multiplies a chain's path probabilities by their ratio before its length is chosen.

    Args:
        prior_weight: pseudo-tokens behind the prior ratio of 1.
        decay: factor applied to the sums once per ``record``.
        bounds: the ratio is clipped to this range.
    """

    def __init__(self, prior_weight: float = 4.0, decay: float = 0.99, bounds: tuple[float, float] = (0.1, 1.5)) -> None:
        self.ranks = RankCorrection(prior_weight, decay, bounds, CHAIN_BANDS)

    def scale(self, probs: np.ndarray) -> np.ndarray:
        """``probs`` (m,), a chain's path probabilities, corrected (kept non-increasing and <= 1)."""
        if not probs.shape[0]:
            return probs
        return np.minimum.accumulate(np.minimum(probs * self.ranks.factors(probs.shape[0]), 1.0))

    def record(self, probs: np.ndarray, accepted: int) -> None:
        """One chain sent with path probabilities ``probs`` (m,, as given, before ``scale``), of which the
        first ``accepted`` tokens were accepted."""
        positions = np.arange(probs.shape[0])
        self.ranks.record(positions + 1, probs, positions < accepted)
