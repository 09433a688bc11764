"""A draft: one proposed continuation of the context, the value every drafter returns.

At the bottom of the stack with ``retrieval_draft.tree``: drafters, planning,
decode and target all share it, and it imports nothing of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

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
