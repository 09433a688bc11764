"""Our drafters as vLLM's speculative proposer (vLLM's ``custom_class`` method; docs/vllm.md).

    LLM(model=..., speculative_config={
        "method": "custom_class",
        "model": "retrieval_draft.integrations.vllm_proposer.RetrievalDraftProposer",
        "num_speculative_tokens": 8})

vLLM (0.32, ``vllm/v1/spec_decode/custom_class_proposer.py``) imports the class named by
``model``, builds it with its ``VllmConfig`` once per worker process, calls ``load_model(model)``
once, and each engine step ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
slot_mappings=None)`` after its own bookkeeping, so the rows already hold the tokens just sampled.
It wants one token list per request back, which it verifies as one chain: vLLM's tree
verification serves EAGLE only, so our merged tree is reduced to one path
(``RequestChains``). The call carries no request ids; requests are followed through the batch's
own tokens (``request_chains``).

Settings come from the environment of the server process (vLLM's speculative config refuses keys
it does not know), read once when vLLM builds the proposer:

- ``RETRIEVAL_DRAFT_VLLM_DATASTORE``: datastore folders (``retrieval-draft build``), separated by
  ``os.pathsep``; opened and verified once per worker process, checked against the model's
  vocabulary and tokenizer.
- ``RETRIEVAL_DRAFT_VLLM_DRAFTERS``: comma-separated drafter names of the registry (default:
  ``prompt``, ``ngram`` and ``suffix`` per store when there are stores, ``history``); the store
  kinds (``ngram``, ``suffix``) are asked for a request only where the others draft nothing
  (``RequestChains``'s fallbacks).
- ``RETRIEVAL_DRAFT_VLLM_MIN_PROB``: a chain stops where its calibrated path probability falls
  below this (default 0: the step cost decides).
- ``RETRIEVAL_DRAFT_VLLM_STEP_COST``: ``OVERHEAD,PER_TOKEN``, the prior shape of a speculative
  step's cost in plain steps (default ``CostShape()``, measured here), refined from the engine's
  own step times; ``off`` sends every chain whole.

This module imports nothing of vLLM: the config is read by attribute, so tests hand it a stand-in.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from retrieval_draft.draft import Drafter
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.drafters.registry import STORE_DRAFTERS, DraftSources, default_names, make_drafters
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.integrations.request_chains import RequestChains
from retrieval_draft.integrations.step_cost import CostShape, StepCost

LOG = logging.getLogger(__name__)

ENV_DATASTORE = "RETRIEVAL_DRAFT_VLLM_DATASTORE"
ENV_DRAFTERS = "RETRIEVAL_DRAFT_VLLM_DRAFTERS"
ENV_MIN_PROB = "RETRIEVAL_DRAFT_VLLM_MIN_PROB"
ENV_STEP_COST = "RETRIEVAL_DRAFT_VLLM_STEP_COST"
DEFAULT_MIN_PROB = 0.0


@dataclass(frozen=True)
class ProposerSettings:
    """What the proposer drafts from. ``datastores``: store folders, in order; ``drafters``:
    registry names (None: the default menu for the sources); ``min_prob``: ``RequestChains``'s;
    ``step_cost``: the prior shape of the step cost that sizes the chains (learned on from the
    engine's pace), None to send every chain whole."""

    datastores: tuple[str, ...] = ()
    drafters: tuple[str, ...] | None = None
    min_prob: float = DEFAULT_MIN_PROB
    step_cost: CostShape | None = CostShape()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "ProposerSettings":
        """The settings named in ``environ`` (the ``RETRIEVAL_DRAFT_VLLM_*`` variables)."""
        stores = tuple(part for part in environ.get(ENV_DATASTORE, "").split(os.pathsep) if part)
        names = tuple(part.strip() for part in environ.get(ENV_DRAFTERS, "").split(",") if part.strip())
        raw = environ.get(ENV_MIN_PROB, "").strip()
        try:
            min_prob = float(raw) if raw else DEFAULT_MIN_PROB
        except ValueError:
            raise InvalidInputError(f"{ENV_MIN_PROB}={raw!r} is not a number") from None
        if not 0.0 <= min_prob <= 1.0:
            raise InvalidInputError(f"{ENV_MIN_PROB} must lie in [0, 1], got {min_prob}")
        return cls(stores, names or None, min_prob, _step_cost(environ.get(ENV_STEP_COST, "").strip()))


def _step_cost(raw: str) -> CostShape | None:
    """``ENV_STEP_COST``'s value: '' the default shape, ``off`` None, else ``OVERHEAD,PER_TOKEN`` (each >= 0)."""
    if not raw:
        return CostShape()
    if raw.lower() == "off":
        return None
    try:
        overhead, per_token = (float(part) for part in raw.split(","))
    except ValueError:
        raise InvalidInputError(f"{ENV_STEP_COST}={raw!r} is not 'off' or OVERHEAD,PER_TOKEN") from None
    if overhead < 0 or per_token < 0:
        raise InvalidInputError(f"{ENV_STEP_COST} takes costs >= 0, got {raw!r}")
    return CostShape(overhead, per_token)


def proposer_drafters(settings: ProposerSettings, vocab_size: int, tokenizer=None) -> tuple[list[Drafter], list[Drafter]]:
    """(the request's own drafters, the store drafters asked only where those draft nothing) that
    ``settings`` name: its stores opened once per process (``open_checked_stores``: verified, and
    checked against ``vocab_size`` and, given, ``tokenizer``) and a fresh output history of this
    process."""
    stores = ()
    if settings.datastores:
        from retrieval_draft.drafters.datastore import open_checked_stores  # the store readers need datrie

        stores = open_checked_stores(list(settings.datastores), vocab_size=vocab_size, tokenizer=tokenizer)
    sources = DraftSources(stores=stores, history=HistoryDrafter())
    names = settings.drafters or default_names(sources)
    own = [name for name in names if name not in STORE_DRAFTERS]  # an unknown name among them: make_drafters refuses it
    fallbacks = [name for name in names if name in STORE_DRAFTERS]
    return (make_drafters(own, sources) if own else []), (make_drafters(fallbacks, sources) if fallbacks else [])


def warm_up(drafters: Sequence[Drafter]) -> None:
    """Compile the Numba kernels drafting, merging and grading use (cached on disk after the first
    process) on a made-up batch of two steps, so no request of the server pays for them; the
    shared drafters see only ``propose`` calls."""
    block = np.arange(3, 11, dtype=np.int64)
    context = np.concatenate([block, block, block[:3]])
    scratch_history = HistoryDrafter(max_tokens=64)
    scratch_history.add(context)
    chains = RequestChains([PromptLookupDrafter(), scratch_history.for_row(0)], max_tokens=4)
    rows = np.zeros((1, 32), dtype=np.int32)
    rows[0, : context.shape[0]] = context
    first = chains.propose([[int(context[-1])]], np.array([context.shape[0]]), rows)
    step = first[0][:2] + [3]
    rows[0, context.shape[0]: context.shape[0] + len(step)] = step
    chains.propose([step], np.array([context.shape[0] + len(step)]), rows)
    for drafter in drafters:
        drafter.propose(context, 4)


class RetrievalDraftProposer:
    """vLLM's ``custom_class`` proposer: one chain per request from our drafters.

    Args:
        vllm_config: vLLM's ``VllmConfig`` (read: ``speculative_config.num_speculative_tokens``,
            ``model_config.max_model_len``, ``model_config.get_vocab_size()``, and with stores
            ``model_config.tokenizer``).
        settings: default ``ProposerSettings.from_env()``.
        tokenizer: the model's tokenizer for the stores' check; default loaded from
            ``model_config.tokenizer`` when there are stores.
    """

    def __init__(self, vllm_config, settings: ProposerSettings | None = None, tokenizer=None) -> None:
        settings = settings if settings is not None else ProposerSettings.from_env()
        model_config = vllm_config.model_config
        k = int(vllm_config.speculative_config.num_speculative_tokens)
        if settings.datastores and tokenizer is None:
            tokenizer = _model_tokenizer(model_config)
        drafters, fallbacks = proposer_drafters(settings, int(model_config.get_vocab_size()), tokenizer)
        self.settings = settings
        cost = None if settings.step_cost is None else StepCost(settings.step_cost, prior_span=k)
        self.chains = RequestChains(drafters, k, int(model_config.max_model_len), settings.min_prob, cost=cost,
                                    fallbacks=fallbacks)
        warm_up(self.chains.drafters)
        LOG.info("retrieval-draft proposer: %d tokens per chain, drafters %s, fallbacks %s, min_prob %.3g, step cost prior %s",
                 k, ", ".join(d.name for d in drafters), ", ".join(d.name for d in fallbacks) or "none",
                 settings.min_prob, settings.step_cost)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings=None) -> list[list[int]]:
        """One draft per request of the batch (``RequestChains.propose``).

        Args:
            sampled_token_ids: B lists, the tokens each request gained this step (empty: still
                prefilling, no draft).
            num_tokens_no_spec: shape (>= B,), int32; tokens each request holds.
            token_ids_cpu: shape (max_num_seqs, max_model_len), int32; row i's tokens are
                ``token_ids_cpu[i, :num_tokens_no_spec[i]]``.
            slot_mappings: vLLM's KV slots (unused).
        """
        return self.chains.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    def load_model(self, *args, **kwargs) -> None:
        """vLLM hands the target model to every drafter; drafting from retrieval needs none."""


def _model_tokenizer(model_config):
    """The served model's tokenizer (a local folder or the HF cache), for the stores' fingerprint check."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_config.tokenizer, revision=getattr(model_config, "tokenizer_revision", None),
                                         trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)))
