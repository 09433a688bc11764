"""Drafts aimed at the first token: retrieval from the context extended by each likely next token.

Retrieval drafts only when the context's tail occurred before; on open text the
step's first token is where drafts miss most (no drafter holds it in about two
steps of three). The model's own recent predictions name likely next tokens:
the recycling table holds, per token, the top-k the model last predicted after
it (``RecyclingDrafter``). Two rows of it bear on the token after the pending
one (the tree's root, ``context[-1]``):

- the successors of the pending token itself (what followed it last time);
- the successors of the token before it, i.e. the top-k of the very logits row
  that chose the pending token: besides the chosen token, that row's runners-up
  often hold the token after it (the observation behind LogitSpec, which calls
  it next-next token speculation).

For each candidate c (its table probability as the first token's estimate),
``CandidateLookupDrafter`` asks its inner drafters (prompt lookup, the output
history) for continuations of ``context + [c]``: a match that ends in c is one
token longer and more specific than the context's own. Each continuation d
becomes the draft [c, *d]. The planner calibrates this drafter's rates like any
other's and the drafter gate drops it where it does not pay for its lookups.
"""

from __future__ import annotations

import numpy as np

from retrieval_draft.draft import Drafter, Proposals
from retrieval_draft.drafters.recycling import EMPTY, RecyclingDrafter
from retrieval_draft.errors import InvalidInputError


class CandidateLookupDrafter(Drafter):
    """Continuations retrieved after each likely next token.

    Args:
        recycled: the model's recycling table (read only; its own drafter records it).
        inner: drafters asked for continuations of the extended context (prompt lookup, history).
        max_candidates: most candidate next tokens tried per step.
    """

    name = "candidates"
    prior_scale = 0.5  # table probabilities come from other contexts; calibration corrects them

    def __init__(self, recycled: RecyclingDrafter, inner: list[Drafter], max_candidates: int = 6) -> None:
        if max_candidates < 1 or not inner:
            raise InvalidInputError("CandidateLookupDrafter needs inner drafters and max_candidates >= 1")
        self.recycled = recycled
        self.inner = inner
        self.max_candidates = max_candidates
        self._found = Proposals([drafter.name for drafter in inner])  # the inner drafters' drafts, one candidate at a time

    def candidates(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Likely tokens after ``context`` (n,): ids (c,) and table probabilities (c,), most probable
        first, each id once, the pending token's own successors before its predecessor's runners-up."""
        table, probs = self.recycled.successors, self.recycled.probs
        rows = [context[-1]] + ([context[-2]] if context.shape[0] > 1 else [])
        ids, scores = [], []
        for row in rows:
            if 0 <= row < table.shape[0]:
                ids.append(table[row])
                scores.append(probs[row])
        if not ids:
            return np.empty(0, np.int64), np.empty(0)
        ids_all, scores_all = np.concatenate(ids).astype(np.int64), np.concatenate(scores).astype(np.float64)
        live = (ids_all != EMPTY) & (scores_all > 0)
        ids_all, scores_all = ids_all[live], scores_all[live]
        _, first = np.unique(ids_all, return_index=True)
        first = np.sort(first)[: self.max_candidates]
        return ids_all[first], np.minimum(scores_all[first], 1.0)

    def propose_into(self, context: np.ndarray, max_len: int, out: Proposals) -> None:
        """For each candidate c: [c, *d] for every continuation d the inner drafters give of ``context + [c]``."""
        if max_len < 2 or context.shape[0] < 1:
            return
        ids, scores = self.candidates(context)
        extended = np.empty(context.shape[0] + 1, dtype=np.int64)
        extended[:-1] = context
        found = self._found
        for token, score in zip(ids.tolist(), scores.tolist()):
            extended[-1] = token
            found.clear()
            for drafter in self.inner:
                drafter.propose_into(extended, max_len - 1, found.writer(drafter.name))
            tokens, probs, lengths = found.flat()
            start = 0
            for n in lengths.tolist():
                out.add(np.concatenate(([token], tokens[start : start + n])), np.concatenate(([score], probs[start : start + n])))
                start += n
