"""Which drafters to ask this step: only those whose drafts pay for their time.

Asking a drafter costs its ``propose`` time every step; it pays back only the
tokens it gets right that no other drafter offered (its *marginal* tokens),
each worth about one plain decoding step. A code datastore on a chat prompt
costs time and rarely adds a token. ``DrafterGate`` keeps, per drafter,
smoothed seconds per query and marginal tokens per query; a drafter whose
expected saving falls below its cost is asked only every 2nd, 4th, ... up to
every ``max_interval``-th step, and back every step as soon as a query shows
it pays again. A drafter costing under ``free_share`` of a step is always
asked: skipping it could save almost nothing. Outputs never depend on the
gate, only speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from retrieval_draft.draft import Proposals


@dataclass
class DrafterRecord:
    """Smoothed observations of one drafter (seconds and tokens per query)."""

    seconds: float = 0.0
    marginal: float = 0.0
    queries: int = 0
    interval: int = 1  # ask every ``interval``-th step
    wait: int = 0  # steps left before the next query


class DrafterGate:
    """Skips drafters that cost more than they add.

    Args:
        decay: weight of the old average in each update (0.9: about the last ten queries).
        min_queries: queries observed before a drafter may be skipped.
        max_interval: longest gap, in steps, between two queries of a drafter that does not pay.
        free_share: a drafter whose query costs less than this fraction of
            ``token_seconds`` is never skipped.
    """

    def __init__(
        self, decay: float = 0.9, min_queries: int = 8, max_interval: int = 32, free_share: float = 0.01
    ) -> None:
        if not 0.0 <= decay < 1.0 or min_queries < 1 or max_interval < 1 or free_share < 0:
            raise ValueError("decay must lie in [0, 1), min_queries and max_interval >= 1, free_share >= 0")
        self.decay = decay
        self.min_queries = min_queries
        self.max_interval = max_interval
        self.free_share = free_share
        self.records: dict[str, DrafterRecord] = {}

    def should_ask(self, name: str) -> bool:
        """Whether to query drafter ``name`` this step (counts the step down when not)."""
        record = self.records.setdefault(name, DrafterRecord())
        if record.wait > 0:
            record.wait -= 1
            return False
        return True

    def observe(self, proposals: Proposals, matched: np.ndarray, token_seconds: float) -> None:
        """Update the drafters asked this step (``proposals.asked``) and reschedule them.

        Args:
            proposals: the row's drafts this step, with each drafter's ``propose`` seconds.
            matched: shape (d,), how many leading tokens of each draft equal the tokens the
                model produced (``matched_prefixes``): a drafter got right the longest of its own.
            token_seconds: what one more accepted token saves (about one plain step).
        """
        right = np.zeros(len(proposals.names), np.int64)
        np.maximum.at(right, proposals.owners[: proposals.count], matched)
        for number in np.flatnonzero(proposals.asked).tolist():
            name, seconds = proposals.names[number], float(proposals.seconds[number])
            others = int(np.delete(right, number).max(initial=0))
            record = self.records.setdefault(name, DrafterRecord())
            first = record.queries == 0
            d = 0.0 if first else self.decay
            record.seconds = d * record.seconds + (1 - d) * seconds
            record.marginal = d * record.marginal + (1 - d) * max(int(right[number]) - others, 0)
            record.queries += 1
            pays = record.marginal * token_seconds >= record.seconds or record.seconds < self.free_share * token_seconds
            if pays or record.queries < self.min_queries:
                record.interval = 1
            else:
                record.interval = min(record.interval * 2, self.max_interval)
            record.wait = record.interval - 1
