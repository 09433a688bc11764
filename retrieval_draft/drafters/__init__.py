"""Drafters: sources of draft tokens that need no second model."""

from retrieval_draft.drafters.base import Draft, Drafter

__all__ = ("Draft", "Drafter")
