"""Plumbing of ``generate``'s own arguments into a ``custom_generate`` callable, and EOS ids.

transformers 5.x drops ``generate``'s ``tokenizer``, ``assistant_model`` and
``streamer`` for a callable ``custom_generate``: ``stop_strings`` fails with its
missing-tokenizer error, and a streamer gets the prompt (``generate`` puts it before
calling the callable) and nothing more. ``receives_generate_kwargs`` marks our
callable so that those arguments reach it; ``stop_strings`` then stops exactly where
HF stops, and the streamer receives every new token and ``end()``. This module and the
rest of ``model`` are the only code touching transformers internals.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

from transformers.generation.utils import GenerationMixin

# Marks callables that receive ``generate``'s ``tokenizer`` / ``assistant_model`` / ``streamer``, which
# transformers drops.
RECEIVES_GENERATE_KWARGS = "__retrieval_draft_receives_generate_kwargs__"


def eos_token_ids(generation_config) -> frozenset[int]:
    """The EOS ids ``generate`` prepared on ``generation_config`` (empty when none)."""
    eos = generation_config._eos_token_tensor
    return frozenset(eos.flatten().tolist()) if eos is not None else frozenset()


def pad_token_id(generation_config, eos_ids: frozenset[int]) -> int:
    """The id HF's batched ``generate`` writes after a row's end: the prepared pad id, else
    (as HF falls back) an EOS id, else 0 (then no row can end early by EOS)."""
    pad = generation_config._pad_token_tensor
    if pad is not None:
        return int(pad.flatten()[0])
    return min(eos_ids) if eos_ids else 0


def receives_generate_kwargs(function: Callable) -> Callable:
    """Register ``function`` (a ``custom_generate`` callable) to receive ``generate``'s
    ``tokenizer``, ``assistant_model`` and ``streamer`` where its signature names them (a streamer
    that arrives so has been given the prompt already); returns ``function`` unchanged."""
    _install_pass_through()
    setattr(function, RECEIVES_GENERATE_KWARGS, True)
    return function


def _install_pass_through() -> None:
    """Wrap ``GenerationMixin._extract_generation_mode_kwargs`` once (no-op where it is absent).

    This is the one process-wide change to transformers this library makes: the
    wrapper adds ``tokenizer`` / ``assistant_model`` / ``streamer`` back only for callables marked
    by ``receives_generate_kwargs``; every other ``generate`` call is unchanged.
    """
    original = getattr(GenerationMixin, "_extract_generation_mode_kwargs", None)
    if original is None or getattr(original, "_passes_on", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def extract(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs).arguments
        custom, extra = bound.get("custom_generate"), bound.get("kwargs") or {}
        given = {"tokenizer": extra.get("tokenizer"), "assistant_model": bound.get("assistant_model"),
                 "streamer": bound.get("streamer")}
        mode_kwargs = original(self, *args, **kwargs)
        target = custom.func if isinstance(custom, functools.partial) else custom
        if getattr(target, RECEIVES_GENERATE_KWARGS, False):
            wanted = inspect.signature(target).parameters
            mode_kwargs.update({k: v for k, v in given.items() if v is not None and k in wanted})
        return mode_kwargs

    extract._passes_on = True
    GenerationMixin._extract_generation_mode_kwargs = extract
