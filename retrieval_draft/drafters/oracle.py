"""An oracle drafter that replays a known continuation: the verifier's ceiling.

Used by tests (drafts that are all accepted) and by the benchmark harness
(how fast the verifier could go on this machine with perfect drafts).
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.draft import Draft, Drafter


class OracleDrafter(Drafter):
    """Proposes the next tokens of ``reference`` whenever the context is its prefix.

    Args:
        reference: shape (n,), int64, the full sequence (prompt + expected output).
    """

    name = "oracle"
    prior_scale = 1.0  # its drafts are the reference output itself

    def __init__(self, reference: np.ndarray) -> None:
        self.reference = np.asarray(reference, dtype=np.int64).reshape(-1)

    def propose(self, context: np.ndarray, max_len: int) -> list[Draft]:
        n = context.shape[0]
        if n >= self.reference.shape[0] or not np.array_equal(self.reference[:n], context):
            return []
        tokens = self.reference[n : n + max_len]
        return [Draft(tokens, np.ones(tokens.shape[0]))]
