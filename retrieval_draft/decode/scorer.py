"""What the decode loop needs of a model: the ``TreeScorer`` protocol.

``model.tree_model.TreeModel`` implements it over an HF causal LM; test doubles and
``tools.diagnostics.replay.ReplayModel`` (a stand-in that knows the greedy output)
implement it without one. The engine calls nothing else.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from retrieval_draft.tree import DraftTree


class TreeScorer(Protocol):
    """B rows of a batch, each with its cached tokens; trees are scored one step at a time.

    Attributes:
        skinny_sizes: forward sizes (rows x width) that take the CPU skinny matmul; the engine
            sets it each step from the planner (``TreePlanner.matmul_sizes``), a model
            without that path ignores it.
    """

    skinny_sizes: frozenset

    @property
    def rows(self) -> int:
        """B, the rows in the batch."""

    @property
    def length(self) -> int:
        """T, the cache slots in use (the longest row's end)."""

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run (B, L) left-padded prompts into a fresh cache; the last position's logits, (B, V) float32."""

    def verifiable(self, tree: DraftTree) -> DraftTree:
        """``tree`` as this model can score it (its best chain where trees cannot be scored)."""

    def pack(self, trees: list[DraftTree]) -> Any:
        """Row i's tree ``trees[i]`` as the forward's inputs (host work, nothing cached)."""

    def score(self, packed: Any) -> torch.Tensor:
        """One forward over packed trees: logits (B, W, V) float32, W = the largest tree."""

    def keep(self, nodes: list[np.ndarray]) -> None:
        """Keep row i's tree nodes ``nodes[i]`` (increasing, a path from root 0) in the cache."""

    def drop_rows(self, finished: list[int]) -> list[int]:
        """Remove rows ``finished``; for each remaining row in its new place, its index before."""
