"""One batch row's handle on a drafter that several rows share.

The default drafters include objects kept across calls (the model's output
history), and a caller may pass one flat drafter list for a whole batch. A
drafter's ``begin`` / ``accept`` / ``end`` describe ONE generation, so rows
must not interleave them on a shared instance. ``RowView`` gives each row
its own lifecycle: ``propose`` goes to the shared drafter with the row's own
context; the row's prompt is held here, and when the row ends the shared
drafter sees that row's ``begin(prompt)`` and ``end(output)`` back to back
(the history then pairs each prompt with its own output). ``accept`` is not
passed on: a shared drafter learns each row's generation at its end.
``tree_request`` / ``tree_receive`` are passed on as they come (the recycling table is keyed by
token, not by generation, so rows may fill it in any order).
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.draft import Draft
from retrieval_draft.drafters.base import Drafter


class RowView(Drafter):
    """A per-row view of ``shared``; same name and prior as it."""

    def __init__(self, shared: Drafter) -> None:
        self.shared = shared
        self.name = shared.name
        self.prior_scale = shared.prior_scale
        self.observes_trees = shared.observes_trees
        self._prompt = np.empty(0, dtype=np.int64)

    def begin(self, prompt: np.ndarray) -> None:
        self._prompt = np.asarray(prompt, dtype=np.int64).copy()

    def propose(self, context: np.ndarray, max_len: int) -> list[Draft]:
        return self.shared.propose(context, max_len)

    def tree_request(self, logits):
        return self.shared.tree_request(logits)

    def tree_receive(self, tokens: np.ndarray, columns: np.ndarray) -> None:
        self.shared.tree_receive(tokens, columns)

    def end(self, output: np.ndarray) -> None:
        self.shared.begin(self._prompt)
        self.shared.end(output)


def per_row(drafter_lists: list[list[Drafter]]) -> list[list[Drafter]]:
    """The same lists with every instance that appears in more than one row wrapped in a ``RowView``."""
    rows_of: dict[int, set[int]] = {}
    for row, drafters in enumerate(drafter_lists):
        for drafter in drafters:
            rows_of.setdefault(id(drafter), set()).add(row)
    return [
        [RowView(d) if len(rows_of[id(d)]) > 1 else d for d in drafters]
        for drafters in drafter_lists
    ]
