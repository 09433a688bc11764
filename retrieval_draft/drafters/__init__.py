"""Drafters: sources of draft tokens that need no second model."""

from retrieval_draft.draft import Draft
from retrieval_draft.drafters.base import Drafter

__all__ = ("Draft", "Drafter")
