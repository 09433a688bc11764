"""Drafts: the interface every drafter speaks, and the one shape its drafts take.

A drafter (``Drafter``) knows only token ids. Each decoding step the engine hands it the whole
context (prompt plus tokens emitted so far) and asks for a few continuations; the engine merges
all drafters' continuations into one token tree (``retrieval_draft.tree``).

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
from typing import TYPE_CHECKING, Sequence

import numba
import numpy as np

if TYPE_CHECKING:
    import torch


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
    - per drafter (``names``): ``seconds`` float64 its time this step (``propose``, and recording
      the verified tree for an observer), ``asked`` bool whether it was asked this step.

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

    def charge(self, name: str, seconds: float) -> None:
        """Drafter ``name`` spent ``seconds`` more this step outside ``propose`` (recording the
        verified tree): part of what asking it costs."""
        self.seconds[self._index[name]] += seconds

    def anyone_asked(self) -> bool:
        """Whether any drafter was asked this step."""
        return any(self.asked.tolist())  # a few drafters: a list beats numpy's any call

    def was_asked(self, name: str) -> bool:
        """Whether drafter ``name`` was asked this step."""
        return bool(self.asked[self._index[name]])

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

    def runs(self) -> list[tuple[int, int, int]]:
        """(drafter, first entry, end entry) of each run of consecutive drafts by one drafter,
        in order: a drafter's drafts are contiguous unless two drafters share its name."""
        return owner_runs(self.entry_owners[: self.used])

    def matched(self, truth: np.ndarray) -> np.ndarray:
        """(d,) int64: how many leading tokens of each draft equal ``truth`` (t,) int64, the tokens
        the model produced (``matched_prefixes``)."""
        if not self.count:
            return EMPTY_INT64
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
# An empty (0,) int64 array, read only, shared by the step's shortcuts for rows with nothing to
# process: ``Proposals.matched`` of no drafts, ``DraftTree.ranked`` of a lone root, a lone root's verdict.
EMPTY_INT64 = np.empty(0, dtype=np.int64)
EMPTY_INT64.flags.writeable = False


def owner_runs(owners: np.ndarray) -> list[tuple[int, int, int]]:
    """(owner, start, end) of each run of equal values in ``owners`` (m,), in order. A step's
    drafts hold a few dozen entries: one read into a list and a loop over it beat the half a
    dozen numpy calls that cutting the array takes."""
    values = owners.tolist()
    runs, start = [], 0
    for end in range(1, len(values)):
        if values[end] != values[start]:
            runs.append((values[start], start, end))
            start = end
    if values:
        runs.append((values[start], start, len(values)))
    return runs


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



class Drafter:
    """A source of draft continuations. Subclasses implement ``propose``.

    A drafter a user writes implements ``propose`` (returning ``Draft`` values); the built-in
    ones implement ``propose_into``, writing into the row's ``Proposals`` buffer, and get
    ``propose`` from it. Implement one of the two.

    Lifecycle for one generation: the engine takes each row's handle, ``for_row(row)``, then
    on it ``begin(prompt)``, per step ``propose_into(context, max_len, out)``, ``tree_request(logits)``
    and ``tree_receive(tokens, columns)`` once the tree is scored (observers only), then
    ``accept(new_tokens)``; and ``end(output)`` once that row stops.
    """

    name: str = "drafter"
    # How far the planner believes ``Draft.probs`` before it has graded any of
    # this drafter's drafts: 1.0 for probabilities that are measured
    # acceptance rates, lower for heuristic scores (see AcceptanceCalibrator).
    prior_scale: float = 0.5
    # Whether ``tree_request`` / ``tree_receive`` want each verified tree's logits (the engines call only such
    # drafters, and only for the steps they were asked in: a drafter the gate skips records nothing either).
    observes_trees: bool = False
    # The most nodes of one verified tree an observer records: those the planner rated likeliest
    # (``DraftTree.likeliest``); None: every node.
    max_observed_nodes: int | None = None

    def for_row(self, row: int) -> "Drafter":
        """The handle that serves batch row ``row`` (0 for one prompt) through one generation.

        Rows of a batch may share one drafter, so calls for different rows interleave. The
        default hands out the drafter itself, right for drafters whose ``begin`` / ``accept``
        / ``end`` keep no per-generation state (prompt lookup, datastores, the recycling
        table, keyed by token). A drafter that keeps such state returns a handle holding that
        row's state, as ``HistoryDrafter`` does.
        """
        return self

    def begin(self, prompt: np.ndarray) -> None:
        """A new generation starts. ``prompt``: shape (n,), int64 ids."""

    def propose(self, context: np.ndarray, max_len: int) -> list[Draft]:
        """Continuations of ``context`` (shape (n,), int64), each at most ``max_len`` tokens."""
        if type(self).propose_into is Drafter.propose_into:
            raise NotImplementedError(f"{type(self).__name__} implements neither propose nor propose_into")
        out = Proposals([self.name])
        self.propose_into(context, max_len, out.writer(self.name))
        return out.drafts()

    def propose_into(self, context: np.ndarray, max_len: int, out: Proposals) -> None:
        """``propose``'s continuations written into ``out`` (its writer already names this
        drafter): the adapter for a drafter that implements ``propose``."""
        out.extend(self.propose(context, max_len))

    def tree_request(self, logits: "Sequence[torch.Tensor]", nodes: "Sequence[np.ndarray]") -> "torch.Tensor":
        """What to record of the trees just verified, computed on the model's device: shape (n, c),
        int32 (floats as their bit patterns, ``Tensor.view(torch.int32)``), from the rows
        ``nodes[i]`` (shape (m_i,), int64, ascending) of each observed tree's raw logits
        ``logits[i]`` (shape (n_i, V)); n = the sum of the m_i, rows in that order. The engine
        chooses ``nodes`` (``max_observed_nodes``), reads every request of a step in its one host
        read and hands each tree its rows through ``tree_receive``. Called only when
        ``observes_trees``."""
        import torch

        return torch.empty((sum(len(chosen) for chosen in nodes), 0), dtype=torch.int32, device=logits[0].device)

    def tree_receive(self, tokens: np.ndarray, columns: np.ndarray) -> None:
        """This drafter's ``tree_request`` columns (shape (m, c), int32, host) for the observed
        nodes of one tree, whose tokens are ``tokens`` (shape (m,), int64)."""

    def observe_tree(self, tokens: np.ndarray, logits: "torch.Tensor", nodes: np.ndarray | None = None) -> None:
        """``tree_request`` then ``tree_receive`` for the rows ``nodes`` (shape (m,), int64,
        ascending; None: every row) of one tree's ``logits`` (shape (n, V); its node tokens
        ``tokens``, shape (n,)), with a read of its own: the node-by-node walk on CPU, and use
        outside the engines (the one-read path reads every request of a step together)."""
        chosen = np.arange(tokens.shape[0]) if nodes is None else nodes
        self.tree_receive(tokens[chosen], self.tree_request([logits], [chosen]).numpy(force=True))

    def accept(self, new_tokens: np.ndarray) -> None:
        """Tokens just appended to the context (shape (k,), int64)."""

    def end(self, output: np.ndarray) -> None:
        """Generation stopped; ``output`` holds the new tokens, shape (m,)."""
