"""The shape of drafts: one row's proposals for a step, laid end to end in one buffer.

At the bottom of the stack with ``retrieval_draft.tree``: drafters, planning, decode and the
model adapter all share it, and it imports nothing of theirs. Every built-in drafter writes its
drafts straight into a row's ``Proposals`` (arrays allocated once per generation and reused
every step); merging, calibration, grading, the drafter gate and the verdict read the same
arrays. ``Draft`` is the value a drafter a user writes returns from ``Drafter.propose``; it is
copied into the buffer on arrival. ``matched_prefixes`` is the one matcher: how far each draft
agrees with the tokens the model produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numba
import numpy as np


@dataclass(frozen=True)
class Draft:
    """One proposed continuation of the context (what ``Drafter.propose`` returns).

    Attributes:
        tokens: shape (n,), int64 token ids that would follow the context.
        probs: shape (n,), float64 in (0, 1]; ``probs[i]`` estimates the
            probability that ``tokens[i]`` is accepted given that
            ``tokens[:i]`` were. The tree multiplies them along a path.
    """

    tokens: np.ndarray
    probs: np.ndarray

    def __post_init__(self) -> None:
        tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        probs = np.asarray(self.probs, dtype=np.float64).reshape(-1)
        if tokens.shape != probs.shape:
            raise ValueError(f"Draft tokens {tokens.shape} and probs {probs.shape} differ in shape")
        if probs.size and not (0.0 < probs.min() and probs.max() <= 1.0):
            raise ValueError("Draft probs must lie in (0, 1]")
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "probs", probs)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class Proposals:
    """One row's drafts for one step, from all its drafters, laid end to end.

    Arrays (grown by doubling when a step proposes more, otherwise allocated once and reused;
    ``clear`` starts the next step):

    - per entry (a draft token), first ``used``: ``tokens`` int64 ids, ``probs`` float64 each
      token's conditional acceptance guess in (0, 1] (given the draft's earlier tokens were
      accepted), ``depths`` int64 its index within its draft, ``entry_owners`` int64 its drafter;
    - per draft, first ``count``: ``lengths`` int64 its entries (draft i is the next
      ``lengths[i]`` entries), ``owners`` int64 its drafter, an index into ``names``;
    - per drafter (``names``): ``seconds`` float64 its ``propose`` time this step, ``asked`` bool
      whether it was asked this step.

    A drafter writes through ``add`` (one draft), ``add_padded`` (a kernel's (d, L) output) or
    ``extend`` (``Draft`` values), into the drafter ``writer`` last named.
    """

    def __init__(self, names: Sequence[str], capacity: int = 256, max_drafts: int = 32) -> None:
        self.names = list(dict.fromkeys(names))
        self._index = {name: i for i, name in enumerate(self.names)}
        self.tokens = np.empty(capacity, np.int64)
        self.probs = np.empty(capacity, np.float64)
        self.depths = np.empty(capacity, np.int64)
        self.entry_owners = np.empty(capacity, np.int64)
        self.lengths = np.empty(max_drafts, np.int64)
        self.owners = np.empty(max_drafts, np.int64)
        self.seconds = np.zeros(len(self.names))
        self.asked = np.zeros(len(self.names), np.bool_)
        self.used = 0
        self.count = 0
        self._owner = 0

    @classmethod
    def of(cls, sourced: "Sequence[tuple[str, Draft]]") -> "Proposals":
        """A buffer holding ``sourced`` (drafter name, draft) pairs in order, each drafter asked."""
        proposals = cls([name for name, _ in sourced])
        for name, draft in sourced:
            proposals.writer(name)
            proposals.add(draft.tokens, draft.probs)
        proposals.asked[:] = True
        return proposals

    def clear(self) -> None:
        """Empty the buffer for the next step (arrays kept)."""
        self.used = self.count = 0
        self.seconds[:] = 0.0
        self.asked[:] = False

    def writer(self, name: str) -> "Proposals":
        """Have later writes come from drafter ``name`` (one of ``names``); marks it asked."""
        self._owner = self._index[name]
        self.asked[self._owner] = True
        return self

    def took(self, seconds: float) -> None:
        """The drafter ``writer`` last named spent ``seconds`` more in ``propose`` this step."""
        self.seconds[self._owner] += seconds

    def add(self, tokens: np.ndarray, probs: np.ndarray) -> None:
        """One draft: ``tokens`` (n,) ids and ``probs`` (n,) conditional guesses; an empty one is skipped."""
        n = tokens.shape[0]
        if n == 0:
            return
        self._room(n, 1)
        end = self.used + n
        self.tokens[self.used : end] = tokens
        self.probs[self.used : end] = probs
        self.depths[self.used : end] = _RANGE[:n] if n <= _RANGE.shape[0] else np.arange(n)
        self.entry_owners[self.used : end] = self._owner
        self.lengths[self.count] = n
        self.owners[self.count] = self._owner
        self.used, self.count = end, self.count + 1

    def add_padded(self, tokens: np.ndarray, probs: np.ndarray, lengths: np.ndarray, count: int) -> None:
        """The first ``count`` drafts of a kernel's output: ``tokens`` / ``probs`` (d, L), draft i
        the first ``lengths[i]`` entries of row i."""
        for i in range(count):
            n = int(lengths[i])
            self.add(tokens[i, :n], probs[i, :n])

    def add_flat(self, tokens: np.ndarray, probs: np.ndarray, lengths: np.ndarray) -> None:
        """Drafts laid end to end: ``tokens`` / ``probs`` (m,), draft i the next ``lengths[i]`` (d,) entries."""
        start = 0
        for n in lengths.tolist():
            self.add(tokens[start : start + n], probs[start : start + n])
            start += n

    def extend(self, drafts: "Sequence[Draft]") -> None:
        """``Draft`` values, as a drafter a user writes returns them."""
        for draft in drafts:
            self.add(draft.tokens, draft.probs)

    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Views: every token (m,), every conditional guess (m,), each draft's length (d,)."""
        return self.tokens[: self.used], self.probs[: self.used], self.lengths[: self.count]

    def matched(self, truth: np.ndarray) -> np.ndarray:
        """(d,) int64: how many leading tokens of each draft equal ``truth`` (t,) int64, the tokens
        the model produced (``matched_prefixes``)."""
        return matched_prefixes(self.tokens[: self.used], self.lengths[: self.count], truth)

    def drafts(self) -> list[Draft]:
        """The buffer's drafts as ``Draft`` values (copies), in order."""
        tokens, probs, lengths = self.flat()
        ends = np.cumsum(lengths).tolist()
        return [Draft(tokens[end - n : end].copy(), probs[end - n : end].copy()) for end, n in zip(ends, lengths.tolist())]

    def _room(self, entries: int, drafts: int) -> None:
        """Grow the arrays (doubling) so that ``entries`` more entries and ``drafts`` more drafts fit."""
        if self.used + entries > self.tokens.shape[0]:
            size = max(2 * self.tokens.shape[0], self.used + entries)
            for name in ("tokens", "probs", "depths", "entry_owners"):
                old = getattr(self, name)
                new = np.empty(size, old.dtype)
                new[: self.used] = old[: self.used]
                setattr(self, name, new)
        if self.count + drafts > self.lengths.shape[0]:
            size = max(2 * self.lengths.shape[0], self.count + drafts)
            for name in ("lengths", "owners"):
                old = getattr(self, name)
                new = np.empty(size, old.dtype)
                new[: self.count] = old[: self.count]
                setattr(self, name, new)


_RANGE = np.arange(64, dtype=np.int64)  # the depths of a draft's first 64 entries (never written)
_RANGE.flags.writeable = False


@numba.njit(cache=True, nogil=True)
def matched_prefixes(tokens: np.ndarray, lengths: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """(d,) int64: how many leading tokens of each draft laid end to end in ``tokens`` (m,)
    (``lengths`` (d,)) equal ``truth`` (t,), the tokens the model produced."""
    matched = np.zeros(lengths.shape[0], np.int64)
    start = 0
    for d in range(lengths.shape[0]):
        n = min(lengths[d], truth.shape[0])
        j = 0
        while j < n and tokens[start + j] == truth[j]:
            j += 1
        matched[d] = j
        start += lengths[d]
    return matched
