"""The drafter interface: every source of draft tokens speaks it.

A drafter knows only token ids. Each decoding step the engine hands it the
whole context (prompt plus tokens emitted so far) and asks for a few
continuations; the engine merges all drafters' continuations into one token
tree (see ``retrieval_draft.tree``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from retrieval_draft.draft import Draft, Proposals

if TYPE_CHECKING:
    import torch


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
    # Whether ``tree_request`` / ``tree_receive`` want each verified tree's logits (the engines call only such drafters).
    observes_trees: bool = False

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

    def tree_request(self, logits: "Sequence[torch.Tensor]") -> "torch.Tensor":
        """What to record of the trees just verified, computed on the model's device: shape (n, c),
        int32 (floats as their bit patterns, ``Tensor.view(torch.int32)``), from each observed
        tree's raw logits ``logits[i]`` (shape (n_i, V); n = the sum of the n_i, rows in that
        order). The engine reads every request of a step in its one host read and hands each
        tree its rows through ``tree_receive``. Called only when ``observes_trees``."""
        import torch

        return torch.empty((sum(part.shape[0] for part in logits), 0), dtype=torch.int32, device=logits[0].device)

    def tree_receive(self, tokens: np.ndarray, columns: np.ndarray) -> None:
        """This drafter's ``tree_request`` columns (shape (n, c), int32, host) for the tree whose
        node tokens are ``tokens`` (shape (n,), int64)."""

    def observe_tree(self, tokens: np.ndarray, logits: "torch.Tensor") -> None:
        """``tree_request`` then ``tree_receive`` with a read of its own (for use outside the engines)."""
        from retrieval_draft.model.transfer import to_host

        self.tree_receive(tokens, to_host(self.tree_request([logits])))

    def accept(self, new_tokens: np.ndarray) -> None:
        """Tokens just appended to the context (shape (k,), int64)."""

    def end(self, output: np.ndarray) -> None:
        """Generation stopped; ``output`` holds the new tokens, shape (m,)."""
