"""Stopping criteria that belong to one HTTP request, handed to that request's ``generate``.

HF's server runs every ``generate`` of a model on one inference thread, one at a time, and builds
its arguments itself: a request has no way to give its generation a stopping criterion. This module
gives it one, for the served model whether it decodes with ours or plain HF's:

- ``add_request_stop(criterion)``, called while a request is handled (the disconnect watcher,
  ``disconnect``; the ``/infill`` route's editor rules, ``editor_stops``), keeps ``criterion`` in a
  context variable of the request's task;
- ``jobs_in_request_context`` (while the server runs) makes the inference thread run each job in a
  copy of the context of the request that submitted it, so the job sees that request's criteria;
- ``with_request_stops(model)`` wraps the served model's ``generate`` once: each call adds the
  criteria of its request to its ``stopping_criteria``. A request whose client left before its
  generation started (``ClientGone``) is not generated at all: the call returns the prompt.

Both decodings ask stopping criteria after every new token (ours in ``decode.engine.cut_at_stop``),
so a criterion that turns true stops the generation at that token. Each criterion's first call sees
the prompt and the first new token, which is how it knows where the new tokens begin.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import threading
from typing import Iterator

import torch
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

LOG = logging.getLogger(__name__)  # ``retrieval-draft serve`` shows it (INFO)

_STOPS: contextvars.ContextVar[tuple[StoppingCriteria, ...]] = contextvars.ContextVar("request_stops", default=())


class ClientGone(StoppingCriteria):
    """True for every row once ``gone`` (set by the HTTP layer when the client disconnects) is set.

    Attributes:
        gone: a ``threading.Event``, set from the server's event loop, read on the inference thread.
        prompt_tokens, tokens: the sequence length (tokens) before the first new token and at the
            last call; None before the first call.
    """

    def __init__(self) -> None:
        self.gone = threading.Event()
        self.prompt_tokens: int | None = None
        self.tokens: int | None = None

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        """``input_ids``: (B, L) the sequences so far; returns (B,) bool, all ``gone.is_set()``."""
        if self.prompt_tokens is None:
            self.prompt_tokens = input_ids.shape[-1] - 1
        self.tokens = input_ids.shape[-1]
        return torch.full((input_ids.shape[0],), self.gone.is_set(), dtype=torch.bool, device=input_ids.device)

    @property
    def new_tokens(self) -> int:
        """New tokens generated when last asked (0 before the first call)."""
        return 0 if self.tokens is None else self.tokens - self.prompt_tokens


def add_request_stop(criterion: StoppingCriteria) -> contextvars.Token:
    """Give the generation of the request being handled (this task and what it submits from now on)
    ``criterion`` too; returns the token that ``_STOPS.reset`` takes to undo it."""
    return _STOPS.set(_STOPS.get() + (criterion,))


def remove_request_stops(token: contextvars.Token) -> None:
    """Undo the ``add_request_stop`` that returned ``token``."""
    _STOPS.reset(token)


def request_stops() -> tuple[StoppingCriteria, ...]:
    """The criteria of the request this code runs for (empty outside a request)."""
    return _STOPS.get()


def generate_with_request_stops(generate):
    """``generate`` (a served model's bound ``generate``) with its request's criteria added to every
    call's ``stopping_criteria``; a call whose client is already gone returns its prompt ids (B, L)
    without generating (a streamer gets the prompt and ``end()``, as ``generate`` would give it)."""

    @functools.wraps(generate)
    def generate_for_request(*args, **kwargs):
        stops = request_stops()
        if not stops:
            return generate(*args, **kwargs)
        gone = next((stop for stop in stops if isinstance(stop, ClientGone)), None)
        if gone is not None and gone.gone.is_set():
            LOG.info("client gone before its generation started: nothing generated")
            return _prompt_only(args, kwargs)
        kwargs["stopping_criteria"] = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []), *stops])
        try:
            return generate(*args, **kwargs)
        finally:
            if gone is not None and gone.gone.is_set():
                LOG.info("client gone: generation stopped after %d new tokens", gone.new_tokens)

    generate_for_request.adds_request_stops = True  # ``with_request_stops`` wraps a model once
    return generate_for_request


def _prompt_only(args: tuple, kwargs: dict) -> torch.Tensor:
    """The prompt ids of a ``generate`` call, streamed as ``generate`` streams a call with nothing new."""
    ids = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
    streamer = kwargs.get("streamer")
    if streamer is not None:
        streamer.put(ids.cpu())
        streamer.end()
    return ids


def with_request_stops(model: torch.nn.Module) -> torch.nn.Module:
    """Wrap ``model.generate`` (``generate_with_request_stops``) unless done already; returns ``model``."""
    if not getattr(model.generate, "adds_request_stops", False):
        model.generate = generate_with_request_stops(model.generate)
    return model


@contextlib.contextmanager
def jobs_in_request_context() -> Iterator[None]:
    """Within the block, HF's inference thread (``transformers.cli.serving.utils.InferenceThread``) runs
    each submitted job in a copy of the submitter's context (``contextvars.copy_context``)."""
    from transformers.cli.serving.utils import InferenceThread

    submit, async_submit = InferenceThread.submit, InferenceThread.async_submit

    def submit_in_context(self, fn, *args, **kwargs):
        return submit(self, contextvars.copy_context().run, fn, *args, **kwargs)

    def async_submit_in_context(self, fn, *args, **kwargs):
        return async_submit(self, contextvars.copy_context().run, fn, *args, **kwargs)

    InferenceThread.submit, InferenceThread.async_submit = submit_in_context, async_submit_in_context
    try:
        yield
    finally:
        InferenceThread.submit, InferenceThread.async_submit = submit, async_submit
