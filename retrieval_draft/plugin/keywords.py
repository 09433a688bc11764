"""Our ``generate`` keyword arguments, checked where they enter: once, before the prefill.

The settings (``tree_budget``, ``max_draft_len``, ``adaptive_tree``, ``draft_learning``,
``draft_seed``) are ``config.DraftConfig``'s to check; this module checks the objects
(``drafters``, ``datastore``, ``draft_tokenizer``, ``draft_planner``, ``draft_streamer``,
``draft_stats``, ``draft_memory``) by type and shape and hands the call one
``PluginKeywords``. Anything wrong raises ``InvalidInputError`` naming the keyword and
what it takes, before the model runs or a store is opened.
"""

from __future__ import annotations

from dataclasses import dataclass

from retrieval_draft.config import DraftConfig
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.draft import Drafter
from retrieval_draft.drafters.registry import DRAFTERS, known_names
from retrieval_draft.errors import InvalidInputError, counted
from retrieval_draft.sessions.memory import PROCESS_MEMORY, PluginMemory
from retrieval_draft.planning.planner import TreePlanner


@dataclass(frozen=True)
class PluginKeywords:
    """One call's keywords, checked.

    Attributes:
        config: the drafting settings.
        drafters: drafter instances, one list per row; None when the call builds its drafters
            (the default menu, or ``names``).
        names: registry names the call's drafters are made from (None: the default menu).
        datastore: ``datastore=`` as given (its items are checked when opened), or None.
        tokenizer: the tokenizer that checks the stores' fingerprint (``draft_tokenizer=``,
            else ``generate``'s ``tokenizer=``), or None.
        planner: a caller's ``TreePlanner``, or None.
        streamers: one streamer (or None) per row.
        prompt_streamed: the streamers have had the prompt already (HF's own ``streamer=``,
            which ``generate`` gives the prompt before calling the decoding function).
        stats: the ``DecodeStats`` to fill in, or None.
        memory: the ``PluginMemory`` this call reads and teaches.
    """

    config: DraftConfig
    drafters: list[list[Drafter]] | None
    names: tuple[str, ...] | None
    datastore: object
    tokenizer: object
    planner: TreePlanner | None
    streamers: list
    prompt_streamed: bool
    stats: DecodeStats | None
    memory: PluginMemory


def plugin_keywords(rows: int, *, drafters=None, datastore=None, draft_tokenizer=None, tokenizer=None,
                    draft_planner=None, streamer=None, draft_streamer=None, draft_stats=None, draft_memory=None,
                    **settings) -> PluginKeywords:
    """Every keyword of ours for a call of ``rows`` rows, checked; ``settings`` are ``DraftConfig``'s fields.
    ``tokenizer`` and ``streamer`` are ``generate``'s own (``model.generate_kwargs``)."""
    config = DraftConfig(**settings)
    instances, names = drafter_rows(drafters, rows)
    if instances is not None and datastore is not None:
        raise InvalidInputError(
            "datastore= drafts through the default drafters or drafter names (e.g. drafters=['prompt', 'ngram', "
            "'suffix']); with drafter instances, add the store's drafters yourself (drafters.datastore.datastore_drafters)"
        )
    _check_type("draft_tokenizer", draft_tokenizer, _is_tokenizer, "a HuggingFace tokenizer (get_vocab, all_special_ids)")
    _check_type("draft_planner", draft_planner, lambda p: isinstance(p, TreePlanner), "a retrieval_draft TreePlanner")
    _check_type("draft_stats", draft_stats, lambda s: isinstance(s, DecodeStats), "a retrieval_draft.DecodeStats()")
    _check_type("draft_memory", draft_memory, lambda m: isinstance(m, PluginMemory), "a retrieval_draft.PluginMemory")
    return PluginKeywords(
        config=config, drafters=instances, names=names, datastore=datastore,
        tokenizer=draft_tokenizer if draft_tokenizer is not None else tokenizer, planner=draft_planner,
        streamers=row_streamers(one_streamer(streamer, draft_streamer, rows), rows),
        prompt_streamed=streamer is not None, stats=draft_stats,
        memory=draft_memory if draft_memory is not None else PROCESS_MEMORY,
    )


def _check_type(keyword: str, value, accepts, wanted: str) -> None:
    if value is not None and not accepts(value):
        raise InvalidInputError(f"{keyword}= takes {wanted} or None, got {type(value).__name__}")


def _is_tokenizer(value) -> bool:
    return all(hasattr(value, name) for name in ("get_vocab", "all_special_ids", "__len__"))


def drafter_rows(drafters, rows: int) -> tuple[list[list[Drafter]] | None, tuple[str, ...] | None]:
    """``drafters=`` as (instances, one list per row; registry names), at most one of them set.

    Takes None (the default menu), drafter instances (every row shares them), registry names
    as the command line's ``--drafters`` takes them (a list, or one comma-separated string),
    or one list of instances per row.
    """
    if drafters is None:
        return None, None
    if isinstance(drafters, str):
        return None, known_names([name.strip() for name in drafters.split(",") if name.strip()])
    items = list(drafters) if isinstance(drafters, (list, tuple)) else None
    if items is not None and all(isinstance(item, Drafter) for item in items):
        return [items for _ in range(rows)], None
    if items and all(isinstance(item, str) for item in items):
        return None, known_names(items)
    per_row = items is not None and len(items) == rows and all(
        isinstance(row, (list, tuple)) and all(isinstance(d, Drafter) for d in row) for row in items
    )
    if not per_row:
        raise InvalidInputError(
            f"drafters= takes drafter names ({', '.join(DRAFTERS)}), Drafter instances, or one list per row "
            f"({counted(rows, 'row')}) of instances; got {_described(drafters)}"
        )
    return [list(row) for row in items], None


def _described(value) -> str:
    """A short description of a bad ``drafters=`` value: its type, and its items' types."""
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(item).__name__ for item in value})
        return f"a {type(value).__name__} of {len(value)} ({', '.join(kinds) or 'empty'})"
    return type(value).__name__


def one_streamer(streamer, draft_streamer, rows: int):
    """The streamer of a call given HF's ``streamer=`` and our ``draft_streamer=``: at most one of
    the two; HF's takes one sequence (``generate`` has given it the whole batch's prompt in one piece)."""
    if streamer is None:
        return draft_streamer
    if draft_streamer is not None:
        raise InvalidInputError("give one streamer: streamer= or draft_streamer=, not both")
    if rows != 1:
        raise InvalidInputError(f"streamer= takes one sequence; for {counted(rows, 'row')} pass "
                                "draft_streamer= a list of one streamer per row")
    return streamer


def row_streamers(streamer, rows: int) -> list:
    """``draft_streamer=`` as one streamer (or None) per row: one row takes a streamer, a batch
    a list of ``rows`` streamers, each fed its row's prompt (real tokens, shape (1, n)), new
    tokens and ``end``. A streamer is anything with ``put`` and ``end`` (HF's streamers)."""
    if streamer is None:
        return [None] * rows
    if rows == 1 and not isinstance(streamer, (list, tuple)):
        streamers = [streamer]
    elif not isinstance(streamer, (list, tuple)) or len(streamer) != rows:
        raise InvalidInputError(
            f"draft_streamer for {counted(rows, 'row')} takes a list of {counted(rows, 'streamer')}, one per row"
        )
    else:
        streamers = list(streamer)
    for item in streamers:
        if item is not None and not (callable(getattr(item, "put", None)) and callable(getattr(item, "end", None))):
            raise InvalidInputError(f"draft_streamer= takes an HF streamer (put and end), got {type(item).__name__}")
    return streamers
