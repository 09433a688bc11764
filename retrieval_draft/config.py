"""The plugin's drafting settings and their defaults: the one owner of each.

The plugin's keyword arguments, the CLI's flags, ``session.GenerationRequest``
and the tools all take their defaults from ``DEFAULTS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from retrieval_draft.errors import InvalidInputError


@dataclass(frozen=True)
class DraftConfig:
    """How drafts are made and verified (none of it changes what is generated).

    Attributes:
        tree_budget: most draft nodes per verification tree (0 = plain decoding).
        max_draft_len: deepest draft path, in tokens.
        adaptive_tree: size each tree by measured cost and observed acceptance;
            False verifies ``tree_budget`` nodes whenever drafts allow.
        draft_learning: start from what earlier calls with the model learned
            (acceptance rates, cost corrections) and draft from their outputs.
    """

    tree_budget: int = 32
    max_draft_len: int = 32
    adaptive_tree: bool = True
    draft_learning: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.tree_budget, int) or self.tree_budget < 0:
            raise InvalidInputError(f"tree_budget must be an integer >= 0, got {self.tree_budget!r}")
        if not isinstance(self.max_draft_len, int) or self.max_draft_len < 1:
            raise InvalidInputError(f"max_draft_len must be an integer >= 1, got {self.max_draft_len!r}")


DEFAULTS = DraftConfig()
