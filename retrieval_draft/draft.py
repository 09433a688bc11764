"""A draft: one proposed continuation of the context, the value every drafter returns.

At the bottom of the stack with ``retrieval_draft.tree``: drafters, planning,
decode and the model adapter all share it, and it imports nothing of theirs. A step's drafts
are also handled laid end to end as flat arrays (``laid_end_to_end``), so that merging and
grading them is one compiled pass rather than a Python loop per draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np


@dataclass(frozen=True)
class Draft:
    """One proposed continuation of the context.

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


def laid_end_to_end(drafts: "list[Draft]") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``drafts`` as flat arrays: every token (m,) int64, every probability (m,) float64 and
    each draft's length (d,) int64, draft i being the next ``lengths[i]`` entries."""
    if not drafts:
        return np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64)
    return (np.concatenate([draft.tokens for draft in drafts]), np.concatenate([draft.probs for draft in drafts]),
            np.array([draft.tokens.shape[0] for draft in drafts], dtype=np.int64))


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
