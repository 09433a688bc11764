"""Drafters: sources of draft tokens that need no second model."""

from retrieval_draft.draft import Draft, Drafter

__all__ = ("Draft", "Drafter")
