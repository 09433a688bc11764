"""One linear draft per request of a serving engine's batch, from our drafters (no engine imported).

A serving engine that verifies one chain per request (vLLM's ``custom_class`` proposer, see
``vllm_proposer``) hands over, each step, the batch's token rows and the tokens each request just
gained. ``RequestChains`` turns that into one draft per request:

1. it keeps each request's state without request ids, from the batch itself: a request is the
   row whose tokens extend a known request's tokens by exactly the tokens it just gained (the
   same row first, then any row: the engine moves requests between rows when others leave);
   a known request that no row continues for ``grace`` calls has ended;
2. it runs the drafters' lifecycle on those requests: ``begin(prompt)`` when one first appears,
   ``accept(new)`` with what it gained, ``end(output)`` when it ends (so the output history
   learns each finished request, prompt and output, as one document);
3. it grades the drafts of the previous step against the tokens the model produced
   (``DraftGrader``: each drafter's guesses mapped to observed acceptance rates);
4. it asks the request's own drafters (prompt lookup, output history), and the fallback drafters
   (a corpus store's) only where those give nothing: a chain has one branch, and a store's draft
   that outbids a draft of the request's own text is mostly one that then fails (replayed
   offline, docs/vllm.md: with the stores asked every step, acceptance lengths fell, 3.33 to 2.95
   on raw code); asked as a fallback the stores cost nothing where they do not help;
5. it merges every drafter's drafts into one calibrated tree under the request's last token
   (``merge_flat`` + ``cap_siblings``, the engine's own candidate tree) and takes the root-to-leaf
   path of at most ``max_tokens`` tokens that is expected to have the most tokens accepted
   (``best_path``: the largest sum of its nodes' path probabilities), cut where the path's
   probability falls below ``min_prob``;
6. it decides how much of each chain to send, for the whole batch at once, by expected gain
   against cost (``step_cost.choose_lengths``): a step gains each request's bonus token plus the
   sum of the path probabilities of the tokens sent, and costs a plain step plus an overhead when
   anything is drafted plus a cost per draft token, as fitted from the engine's own step times
   (``StepClock`` -> ``StepCost``: the time between two calls is the engine's step); so a long
   likely chain goes in full, a weak one not at all.

Ids only: the tokenizer, stores and settings are the caller's (``vllm_proposer``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numba
import numpy as np

from retrieval_draft.draft import Drafter, Proposals, matched_prefixes
from retrieval_draft.integrations.step_cost import ChainCorrection, StepClock, StepCost, choose_lengths
from retrieval_draft.planning.planner import DraftGrader
from retrieval_draft.planning.planner import cap_siblings
from retrieval_draft.tree import DraftTree, merge_flat


@dataclass
class _Request:
    """What is known of one live request: its handles on the drafters, its tokens as of the last
    call (shape (n,), int64), its prompt's length, the drafts offered for its next tokens, and
    how many calls in a row no batch row continued it."""

    handles: list[Drafter]
    tokens: np.ndarray
    prompt_len: int
    drafts: Proposals | None = None
    buffer: Proposals | None = None  # the arrays ``drafts`` is written in: allocated at the first draft, reused
    sent: tuple[np.ndarray, np.ndarray] | None = None  # the chain sent last step: tokens, path probabilities
    missed: int = 0

    def continued_by(self, row_tokens: np.ndarray, gained: int) -> bool:
        """Whether ``row_tokens`` (shape (m,)) are this request's tokens plus ``gained`` new ones."""
        n = self.tokens.shape[0]
        return row_tokens.shape[0] == n + gained and np.array_equal(row_tokens[:n], self.tokens)


class RequestChains:
    """Linear drafts for a batch of requests from ``drafters``, one call per engine step.

    Args:
        drafters: shared drafters (one instance serves every request; each request runs on its
            ``for_row`` handle).
        fallbacks: shared drafters asked for a request only at steps where ``drafters`` draft
            nothing for it (a corpus store's); they follow each request's lifecycle all the same.
        max_tokens: most draft tokens per request (the engine's ``num_speculative_tokens``).
        max_model_len: most tokens a request may hold (prompt + output + drafts + the bonus
            token); None for no limit.
        min_prob: the chain stops at the first token whose calibrated path probability (the
            chance that it and every token before it are accepted) is below this.
        grace: calls a request may go without a batch row before it counts as ended (an engine
            drops a preempted or unscheduled request from its batch for a while).
        grader: the acceptance rates to use and update (shared with whoever passes it).
        cost: the step-cost model to fit from the calls' timing and to size chains by; None sends
            every chain whole (up to ``min_prob``'s cut).
    """

    def __init__(self, drafters: Sequence[Drafter], max_tokens: int, max_model_len: int | None = None,
                 min_prob: float = 0.0, grace: int = 4, grader: DraftGrader | None = None,
                 cost: StepCost | None = None, fallbacks: Sequence[Drafter] = ()) -> None:
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError("min_prob must lie in [0, 1]")
        self.drafters = [*drafters, *fallbacks]  # a request's handles in this order
        self.fallbacks_from = len(drafters)  # the index of the first fallback handle
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        self.min_prob = min_prob
        self.grace = grace
        self.grader = grader if grader is not None else DraftGrader()
        self.grader.register(self.drafters)
        self.cost = cost
        self.clock = StepClock()
        self.correction = ChainCorrection()
        self._requests: dict[int, _Request] = {}  # by the batch row that held it at the last call
        self._parked: list[_Request] = []  # requests no row continued at the last call(s)

    @property
    def live(self) -> int:
        """Requests known and not yet ended (in the batch or parked)."""
        return len(self._requests) + len(self._parked)

    def propose(self, gained: Sequence[Sequence[int]], lengths: np.ndarray, token_rows: np.ndarray) -> list[list[int]]:
        """One draft per batch row.

        Args:
            gained: per row, the tokens the request at that row gained this step (accepted drafts
                + the bonus token); empty for a row that is still prefilling or was skipped.
            lengths: shape (>= B,), int; row i's request holds ``lengths[i]`` tokens, the gained
                ones included.
            token_rows: shape (>= B, >= max(lengths)), int; row i's tokens are
                ``token_rows[i, :lengths[i]]``.

        Returns:
            B lists of token ids, each at most ``max_tokens`` long; empty where a row gained
            nothing or nothing is drafted.
        """
        self.clock.start()
        rows = len(gained)
        contexts = [np.asarray(token_rows[i, : int(lengths[i])], dtype=np.int64) for i in range(rows)]
        before = self.live
        found = self._match(gained, contexts)
        steady = len(found) == rows == before and all(r.tokens.shape[0] > r.prompt_len for r in found.values())
        sample = self.clock.sample(rows, [len(g) for g in gained], steady)
        if sample is not None and self.cost is not None:
            self.cost.observe(*sample)
        truths, offered = [], []
        for row, request in found.items():
            new = contexts[row][request.tokens.shape[0]:]
            if request.drafts is not None and new.size:
                offered.append(request.drafts)
                truths.append(new)
            if request.sent is not None and new.size:
                tokens, probs = request.sent
                self.correction.record(probs, int(matched_prefixes(tokens, np.array([tokens.shape[0]]), new)[0]))
            request.sent = None
            if new.size:
                for handle in request.handles:
                    handle.accept(new)
            request.tokens = contexts[row]
            request.drafts = None
        if truths:
            self.grader.observe(offered, truths, [drafts.matched(truth) for drafts, truth in zip(offered, truths)])
        chains: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for row, request in found.items():
            if len(gained[row]):
                request.drafts, chains[row] = self._chain(request, contexts[row])
        drafts: list[list[int]] = [[] for _ in range(rows)]
        if self.cost is None:
            sizes = [tokens.shape[0] for tokens, _ in chains.values()]
        else:
            corrected = [self.correction.scale(probs) for _, probs in chains.values()]
            sizes = choose_lengths(corrected, self.cost.relative())
        for (row, (tokens, probs)), size in zip(chains.items(), sizes):
            drafts[row] = tokens[:size].tolist()
            found[row].sent = (tokens[:size], probs[:size]) if size else None
        self.clock.sent(rows, sum(len(d) for d in drafts))
        return drafts

    def end_all(self) -> None:
        """End every known request (the engine stops)."""
        for request in [*self._requests.values(), *self._parked]:
            self._end(request)
        self._requests, self._parked = {}, []

    def _match(self, gained: Sequence[Sequence[int]], contexts: list[np.ndarray]) -> dict[int, _Request]:
        """Row -> its request: the known request it continues (same row first, then any other
        unclaimed one), or a new request for a row that gained tokens and continues none. Known
        requests left unclaimed are parked, and ended after ``grace`` calls."""
        unclaimed = {id(request): request for request in [*self._requests.values(), *self._parked]}
        found: dict[int, _Request] = {}
        for row, context in enumerate(contexts):
            request = self._requests.get(row)
            if request is not None and request.continued_by(context, len(gained[row])):
                found[row] = unclaimed.pop(id(request))
        for row, context in enumerate(contexts):
            if row in found:
                continue
            match = next((r for r in unclaimed.values() if r.continued_by(context, len(gained[row]))), None)
            if match is not None:
                found[row] = unclaimed.pop(id(match))
            elif len(gained[row]):
                found[row] = self._start(row, context, len(gained[row]))
        self._parked = []
        for request in unclaimed.values():
            request.missed += 1
            if request.missed > self.grace:
                self._end(request)
            else:
                self._parked.append(request)
        for request in found.values():
            request.missed = 0
        self._requests = found
        return found

    def _start(self, row: int, context: np.ndarray, gained: int) -> _Request:
        """A request first seen at ``row``: its prompt is ``context`` less the ``gained`` tokens."""
        prompt_len = context.shape[0] - gained
        handles = [drafter.for_row(row) for drafter in self.drafters]
        for handle in handles:
            handle.begin(context[:prompt_len].copy())
        # ``tokens`` as of before this step, so that ``propose`` hands the gained tokens to ``accept``
        return _Request(handles, context[:prompt_len], prompt_len)

    def _end(self, request: _Request) -> None:
        output = request.tokens[request.prompt_len:]
        for handle in request.handles:
            handle.end(output)

    def _chain(self, request: _Request, context: np.ndarray) -> tuple[Proposals | None, tuple[np.ndarray, np.ndarray]]:
        """(every drafter's drafts, (the chain's tokens, their path probabilities), each (m,)) for a
        request whose tokens are ``context`` (shape (n,), int64; its last token is the tree's root)."""
        none = (np.zeros(0, np.int64), np.zeros(0, np.float64))
        room = self.max_tokens
        if self.max_model_len is not None:
            room = min(room, self.max_model_len - context.shape[0] - 1)
        if room <= 0 or context.shape[0] == 0:
            return None, none
        if request.buffer is None:
            request.buffer = Proposals([handle.name for handle in request.handles])
        proposals = request.buffer  # last step's drafts were graded before this call drafts again
        proposals.clear()
        for handle in request.handles[: self.fallbacks_from]:
            handle.propose_into(context, room, proposals.writer(handle.name))
        if not proposals.count:
            for handle in request.handles[self.fallbacks_from:]:
                handle.propose_into(context, room, proposals.writer(handle.name))
        if not proposals.count:
            return None, none
        tree = cap_siblings(merge_flat(int(context[-1]), *self.grader.calibrated(proposals)))
        path = best_path(tree, room)
        probs = tree.probs[path]
        kept = int(np.argmax(probs < self.min_prob)) if (probs < self.min_prob).any() else path.shape[0]
        return proposals, (tree.tokens[path[:kept]], probs[:kept])


def best_path(tree: DraftTree, max_len: int) -> np.ndarray:
    """Node indices (root excluded, shape (m,), m <= ``max_len``) of the root-to-leaf path, cut at
    depth ``max_len``, whose nodes' ``probs`` sum highest: the chain of the tree expected to have
    the most tokens accepted. Ties go to the lower node index. Not ``DraftTree.best_chain``, which
    follows the likeliest child at each node: a short branch a little likelier at the first token
    would win there over a long branch that is expected to give far more."""
    return _best_path(tree.parents, tree.depths, tree.probs, max_len)


@numba.njit(cache=True, nogil=True)
def _best_path(parents: np.ndarray, depths: np.ndarray, probs: np.ndarray, max_len: int) -> np.ndarray:  # pragma: no cover - compiled
    """``best_path`` over a topological tree's arrays (each (n,), root 0)."""
    n = parents.shape[0]
    score = np.zeros(n, np.float64)  # a node's probability plus its best child's score
    best = np.full(n, -1, np.int64)
    for node in range(n - 1, 0, -1):  # children before parents; lower indices last, so they win ties
        if depths[node] > max_len:
            continue
        score[node] += probs[node]
        parent = parents[node]
        if best[parent] == -1 or score[node] >= score[best[parent]]:
            if best[parent] != -1:
                score[parent] -= score[best[parent]]
            best[parent] = node
            score[parent] += score[node]
    path = np.empty(min(max_len, n), np.int64)
    length, node = 0, best[0]
    while node != -1 and length < path.shape[0]:
        path[length] = node
        length += 1
        node = best[node]
    return path[:length].copy()
