"""What drafts are worth: the acceptance side of planning.

``DraftGrader`` maps each drafter's guesses to observed acceptance rates (one
``AcceptanceCalibrator`` per drafter, graded every step against what the model produced, pruned
drafts included), so a noisy drafter's many branches cost little and a reliable one's long
chains are kept; it records what the merged trees' ranks delivered against what they promised
(``RankCorrection``), and which drafters pay for their time (``DrafterGate``).
"""

from __future__ import annotations

import numba
import numpy as np

from retrieval_draft.draft import Proposals
from retrieval_draft.planning.calibration import AcceptanceCalibrator, RankCorrection
from retrieval_draft.planning.drafter_gate import DrafterGate
from retrieval_draft.tree import DraftTree


class DraftGrader:
    """Calibrated probabilities for a step's drafts, and learning from the step's outcome.

    Args:
        calibrators: drafter name -> calibrator, shared with whoever passes the same dict (the
            plugin keeps one per model, so each call starts from the rates earlier calls
            observed); None starts from the priors.
        gate: decides which drafters are asked each step (used only with a cost curve, which
            prices an accepted token); default a fresh ``DrafterGate``.
        ranks: what the merged trees' ranks delivered against their probabilities (shared like
            ``calibrators``).
    """

    def __init__(
        self, calibrators: dict[str, AcceptanceCalibrator] | None = None, gate: DrafterGate | None = None,
        ranks: RankCorrection | None = None,
    ) -> None:
        self.calibrators: dict[str, AcceptanceCalibrator] = calibrators if calibrators is not None else {}
        self.gate = gate if gate is not None else DrafterGate()
        self.ranks = ranks if ranks is not None else RankCorrection()

    def register(self, drafters) -> None:
        """Give each drafter not seen before a calibrator with that drafter's ``prior_scale``."""
        for drafter in drafters:
            if drafter.name not in self.calibrators:
                self.calibrators[drafter.name] = AcceptanceCalibrator(prior_scale=drafter.prior_scale)

    def calibrator(self, source: str) -> AcceptanceCalibrator:
        """The calibrator of one drafter (created with the default prior on first use)."""
        if source not in self.calibrators:
            self.calibrators[source] = AcceptanceCalibrator()
        return self.calibrators[source]

    def calibrated(self, proposals: Proposals) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The row's drafts laid end to end, in order (views of the buffer where nothing
        changes): tokens (m,), calibrated conditional probabilities (m,) and each draft's length
        (d,); one calibrator call per drafter."""
        tokens, raw, lengths = proposals.flat()
        if not tokens.size:
            return tokens, raw, lengths
        depths, owners = proposals.depths[: proposals.used], proposals.entry_owners[: proposals.used]
        present = np.flatnonzero(np.bincount(proposals.owners[: proposals.count], minlength=len(proposals.names)))
        if present.shape[0] == 1:  # one drafter: no masks
            rates = self.calibrator(proposals.names[present[0]]).rates(raw, depths)
        else:
            rates = np.empty_like(raw)
            for number in present.tolist():  # one call per drafter, over all its drafts' tokens
                mine = owners == number
                rates[mine] = self.calibrator(proposals.names[number]).rates(raw[mine], depths[mine])
        np.clip(rates, 1e-6, 1.0, out=rates)
        return tokens, rates, lengths

    def observe(self, proposals: list[Proposals], truths: list[np.ndarray], matched: list[np.ndarray]) -> None:
        """Grade every row's drafts against what the model produced in that row (``truths[i]``,
        accepted + bonus, shape (t_i,); ``matched[i]``: ``matched_prefixes`` of the row's drafts
        against it); rates decay once per step, however many rows."""
        for calibrator in self.calibrators.values():
            calibrator.decay_counts()
        for row, truth, row_matched in zip(proposals, truths, matched):
            self.grade(row, truth, row_matched)

    def grade(self, proposals: Proposals, truth: np.ndarray, matched: np.ndarray | None = None) -> None:
        """Grade every offered draft against ``truth`` (shape (t,) int64; ``matched``:
        ``proposals.matched(truth)`` where the caller has it): a token is tested when the tokens before it in
        its draft equal ``truth``, right when it does too. A drafter's drafts that share a prefix
        grade it once (its first draft's probabilities): a tested token's prefix is ``truth``'s,
        so (drafter, depth, token) names it."""
        tokens, raw, lengths = proposals.flat()
        if not tokens.size:
            return
        if matched is None:
            matched = proposals.matched(truth)
        depths, owners = proposals.depths[: proposals.used], proposals.entry_owners[: proposals.used]
        limit = np.minimum(lengths, truth.shape[0])
        tested = np.where(matched < limit, matched + 1, limit)  # through the first wrong token
        live = depths < np.repeat(tested, lengths)
        # first entry of each (drafter, depth, token) among the tested ones
        key = (owners * (int(depths.max()) + 1) + depths) * (int(tokens.max()) + 1) + tokens
        _, first = np.unique(np.where(live, key, -1), return_index=True)
        first = first[live[first]]
        right = tokens[first] == truth[np.minimum(depths[first], truth.shape[0] - 1)]
        right &= depths[first] < truth.shape[0]
        for number in np.unique(owners[first]).tolist():
            hers = owners[first] == number
            mine = first[hers]
            self.calibrator(proposals.names[number]).record(raw[mine], depths[mine], right[hers])

    def grade_ranks(self, full: DraftTree, order: np.ndarray, truth: np.ndarray) -> None:
        """Record in ``ranks`` which of the candidate tree ``full``'s draft nodes (``order``: their
        indices by decreasing probability, shape (n - 1,)) the model's tokens ``truth`` (accepted +
        bonus, shape (t,)) confirmed, by rank, pruned nodes included."""
        if full.size == 1:
            return
        decided, confirmed = confirmed_nodes(full.tokens, full.parents, full.depths, truth.astype(np.int64, copy=False))
        keep = decided[order]
        ranks = np.arange(1, order.shape[0] + 1)[keep]
        self.ranks.record(ranks, full.probs[order[keep]], confirmed[order[keep]])


@numba.njit(cache=True, nogil=True)
def confirmed_nodes(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, truth: np.ndarray):
    """Of a tree's nodes (n,), topological, root 0: which the model's tokens ``truth`` (t,) decide
    (a node below a refuted one is refuted; one below the bonus token, at depth > t, is not
    decided) and which they confirm (its path equals ``truth``'s first tokens); each (n,) bool."""
    n = tokens.shape[0]
    decided = np.zeros(n, np.bool_)
    confirmed = np.zeros(n, np.bool_)
    decided[0] = True
    confirmed[0] = True
    for node in range(1, n):
        parent = parents[node]
        if not decided[parent]:
            continue
        if not confirmed[parent]:
            decided[node] = True
        elif depths[node] <= truth.shape[0]:
            decided[node] = True
            confirmed[node] = tokens[node] == truth[depths[node] - 1]
    return decided, confirmed

