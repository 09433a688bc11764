"""The drafter menu: one name -> factory table, used by the plugin, the CLI, sessions and tools.

A factory takes the ``DraftSources`` of a call (the opened datastores, the
model's output history) and returns a drafter, or raises ``InvalidInputError``
when a source it needs is missing. Adding a drafter is its module plus one
line in ``DRAFTERS``. The datastore drafters are imported when first made,
so the runtime imports without the store's dependencies (datrie), as on
the GPU machines.

Several stores (a repository's own store beside a general one): each store
kind (``STORE_DRAFTERS``) gives one drafter per store, and with more than one
store each is named ``kind:label`` (``store_labels``), because the planner
learns acceptance rates per drafter name: a repository store's drafts are
accepted far more often inside that repository than a general store's, and
one shared name would blend the two rates into one that fits neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable

from retrieval_draft.draft import Drafter
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.errors import InvalidInputError

if TYPE_CHECKING:  # a type here only: the menu (and the command line) import without torch
    from retrieval_draft.drafters.recycling import RecyclingDrafter
    from retrieval_draft.store.reader import Datastore


@dataclass(frozen=True)
class DraftSources:
    """What drafters may read besides the context: opened datastores, an output history
    and a logits-recycling table (the model's own recorded top-k successors).

    ``store`` is shorthand for ``stores=(store,)``; give one or the other. ``stores``
    holds the datastores in the caller's order (several: e.g. a repository's store
    and a general one).
    """

    store: "Datastore | None" = None
    history: HistoryDrafter | None = None
    recycled: RecyclingDrafter | None = None
    stores: "tuple[Datastore, ...]" = ()

    def __post_init__(self) -> None:
        if self.store is not None and self.stores:
            raise InvalidInputError("DraftSources takes store= or stores=, not both")
        object.__setattr__(self, "stores", (self.store,) if self.store is not None else tuple(self.stores))


def store_labels(stores: "tuple[Datastore, ...]") -> list[str]:
    """One label per store for drafter names: '' for a lone store (names stay ``ngram``, ``suffix``),
    else each store directory's name, with ``#i`` (1-based position) added where two names coincide."""
    if len(stores) <= 1:
        return [""] * len(stores)
    names = [Path(store.path).name for store in stores]
    return [name if names.count(name) == 1 else f"{name}#{i + 1}" for i, name in enumerate(names)]


def _needs_store(make: Callable[["Datastore"], Drafter], name: str) -> Callable[[DraftSources], list[Drafter]]:
    """A factory of one ``make(store)`` drafter per store of the sources, named per ``store_labels``."""

    def factory(sources: DraftSources) -> list[Drafter]:
        if not sources.stores:
            raise InvalidInputError(f"the {name} drafter needs a datastore (datastore= / --datastore DIR)")
        drafters = []
        for store, label in zip(sources.stores, store_labels(sources.stores)):
            drafter = make(store)
            if label:
                drafter.name = f"{name}:{label}"  # the planner's calibrators and gate are keyed by name
            drafters.append(drafter)
        return drafters

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


def _candidates(sources: DraftSources) -> Drafter:
    from retrieval_draft.drafters.candidate_lookup import CandidateLookupDrafter

    inner = [PromptLookupDrafter(max_branches=2)] + ([sources.history] if sources.history is not None else [])
    return CandidateLookupDrafter(_recycled(sources), inner)


# name -> factory: one drafter, or (the store kinds) one per datastore.
DRAFTERS: "MappingProxyType[str, Callable[[DraftSources], Drafter | list[Drafter]]]" = MappingProxyType({
    "prompt": lambda sources: PromptLookupDrafter(),
    "ngram": _needs_store(_ngram, "ngram"),
    "suffix": _needs_store(_suffix, "suffix"),
    "history": _history,
    "recycle": _recycled,
    "candidates": _candidates,
})
STORE_DRAFTERS = ("ngram", "suffix")  # what each datastore adds to the defaults


def default_names(sources: DraftSources) -> tuple[str, ...]:
    """The plugin's default menu: prompt lookup, the datastores' drafters, the output history,
    logits recycling."""
    names = ["prompt"]
    if sources.stores:
        names.extend(STORE_DRAFTERS)
    if sources.history is not None:
        names.append("history")
    if sources.recycled is not None:
        names.append("recycle")
    return tuple(names)


def known_names(names) -> tuple[str, ...]:
    """``names`` (an iterable of registry names) as a tuple; ``InvalidInputError`` for none or
    for a name the registry does not hold."""
    names = tuple(names)
    unknown = [name for name in names if name not in DRAFTERS]
    if unknown or not names:
        raise InvalidInputError(f"unknown drafters {unknown or list(names)!r}; choose from {', '.join(DRAFTERS)}")
    return names


def make_drafters(names, sources: DraftSources) -> list[Drafter]:
    """Drafters for ``names`` (an iterable of registry names, ``known_names``) over ``sources``;
    a store kind gives one drafter per store, in the order of ``sources.stores``."""
    drafters: list[Drafter] = []
    for name in known_names(names):
        made = DRAFTERS[name](sources)
        drafters.extend(made if isinstance(made, list) else [made])
    return drafters
