"""The drafter menu: one name -> factory table, used by the plugin, the CLI, sessions and tools.

A factory takes the ``DraftSources`` of a call (the opened datastore, the
model's output history) and returns a drafter, or raises ``InvalidInputError``
when a source it needs is missing. Adding a drafter is its module plus one
line in ``DRAFTERS``. The datastore drafters are imported when first made,
so the runtime imports without the store's dependencies (datrie), as on
the GPU machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable

from retrieval_draft.drafters.base import Drafter
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.drafters.recycling import RecyclingDrafter
from retrieval_draft.errors import InvalidInputError

if TYPE_CHECKING:
    from retrieval_draft.store.reader import Datastore


@dataclass(frozen=True)
class DraftSources:
    """What drafters may read besides the context: an opened datastore, an output history
    and a logits-recycling table (the model's own recorded top-k successors)."""

    store: "Datastore | None" = None
    history: HistoryDrafter | None = None
    recycled: RecyclingDrafter | None = None


def _needs_store(make: Callable[["Datastore"], Drafter], name: str) -> Callable[[DraftSources], Drafter]:
    def factory(sources: DraftSources) -> Drafter:
        if sources.store is None:
            raise InvalidInputError(f"the {name} drafter needs a datastore (datastore= / --datastore DIR)")
        return make(sources.store)

    return factory


def _ngram(store: "Datastore") -> Drafter:
    from retrieval_draft.drafters.ngram import NgramDrafter  # the store's readers need datrie: imported on use

    return NgramDrafter(store)


def _suffix(store: "Datastore") -> Drafter:
    from retrieval_draft.drafters.suffix import SuffixDrafter

    return SuffixDrafter(store)


def _history(sources: DraftSources) -> Drafter:
    if sources.history is None:
        raise InvalidInputError("the history drafter needs an output history (draft_learning=True)")
    return sources.history


def _recycled(sources: DraftSources) -> Drafter:
    if sources.recycled is None:
        raise InvalidInputError("the recycle drafter needs the model's recycling table (the plugin or a session provides it)")
    return sources.recycled


DRAFTERS: "MappingProxyType[str, Callable[[DraftSources], Drafter]]" = MappingProxyType({
    "prompt": lambda sources: PromptLookupDrafter(),
    "ngram": _needs_store(_ngram, "ngram"),
    "suffix": _needs_store(_suffix, "suffix"),
    "history": _history,
    "recycle": _recycled,
})
STORE_DRAFTERS = ("ngram", "suffix")  # what a datastore adds to the defaults


def default_names(sources: DraftSources) -> tuple[str, ...]:
    """The plugin's default menu: prompt lookup, the datastore's drafters, the output history,
    logits recycling."""
    names = ["prompt"]
    if sources.store is not None:
        names.extend(STORE_DRAFTERS)
    if sources.history is not None:
        names.append("history")
    if sources.recycled is not None:
        names.append("recycle")
    return tuple(names)


def make_drafters(names, sources: DraftSources) -> list[Drafter]:
    """Drafters for ``names`` (an iterable of registry names) over ``sources``."""
    names = list(names)
    unknown = [name for name in names if name not in DRAFTERS]
    if unknown or not names:
        raise InvalidInputError(f"unknown drafters {unknown or names!r}; choose from {', '.join(DRAFTERS)}")
    return [DRAFTERS[name](sources) for name in names]
