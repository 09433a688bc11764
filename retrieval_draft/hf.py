"""The HuggingFace ``generate`` plugin.

    model.generate(**inputs, custom_generate=retrieval_draft.generate, max_new_tokens=N)

returns what ``model.generate(**inputs, max_new_tokens=N)`` returns: the same
tensor under greedy decoding, the same distribution under sampling. Our
options travel as keyword arguments that ``generate`` hands through because
they appear in this function's signature.
"""

from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np
import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from retrieval_draft.cost import CostCache
from retrieval_draft.drafters.base import Drafter
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.engine import DecodeOptions, DecodeStats, speculative_decode
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.model_adapter import TreeModel, context_limit, validate_prompt
from retrieval_draft.planner import TreePlanner

# Forward-cost curves are a property of (model, machine): measured once per
# live model and process, then reused by every call (weakly keyed: no leak).
MEASURED_COSTS = CostCache()

# Learning across calls, per live model (weakly keyed, so it goes with the model):
# its earlier prompts and outputs in this process, which the default drafters
# copy from (bounded by ``HistoryDrafter.max_tokens``, 4 MB), and the acceptance
# rates its planners observed, greedy and sampling apart (a few KB).
OUTPUT_HISTORIES: "weakref.WeakKeyDictionary[torch.nn.Module, HistoryDrafter]" = weakref.WeakKeyDictionary()
LEARNED_RATES: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def generate(
    model,
    input_ids: torch.Tensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    drafters: Sequence[Drafter] | None = None,
    datastore: str | None = None,
    draft_tokenizer=None,
    draft_learning: bool = True,
    tree_budget: int = 32,
    max_draft_len: int = 32,
    adaptive_tree: bool = True,
    draft_planner: TreePlanner | None = None,
    draft_streamer=None,
    draft_stats: DecodeStats | None = None,
    draft_seed: int | None = None,
    **model_kwargs,
) -> torch.Tensor:
    """A ``custom_generate`` callable for ``model.generate``.

    Args (ours; the rest come from ``generate``):
        drafters: drafter instances; default prompt lookup, plus the
            datastore's drafters when ``datastore`` is given.
        datastore: path of a datastore built by ``retrieval-draft build``.
        draft_tokenizer: the tokenizer in use, to check the datastore's fingerprint.
        draft_learning: learn across this process's calls with this model: start
            the tree planner from the acceptance rates earlier calls observed
            (``learned_rates``), and with the default drafters also draft from
            earlier prompts and outputs (``output_history``). Outputs never
            depend on it; False makes every call start afresh.
        tree_budget: most draft nodes per verification tree.
        max_draft_len: deepest draft path.
        adaptive_tree: size each tree by the measured forward cost and the
            observed acceptance (a one-off cost measurement per model and
            process); False verifies ``tree_budget`` nodes every step.
        draft_planner: a ``TreePlanner`` to reuse across calls, so what it
            learned about acceptance carries over; overrides the two above.
        draft_streamer: an HF streamer (``put``/``end``); ``generate`` drops its own
            ``streamer`` for custom callables, so pass it here.
        draft_stats: a ``DecodeStats`` to fill in with this call's statistics.
        draft_seed: seed for sampling; the same seed gives the same output.

    Returns:
        shape (1, L + m), the prompt followed by the new tokens.
    """
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is not None and not bool(attention_mask.all()):
        raise InvalidInputError("padded inputs are not supported; pass one unpadded sequence")
    max_new_tokens = int(generation_config.max_length) - input_ids.shape[1]
    validate_prompt(input_ids, max_new_tokens, model.config.vocab_size, context_limit(model))
    eos = generation_config._eos_token_tensor
    options = DecodeOptions(
        max_new_tokens=max_new_tokens,
        eos_ids=frozenset(eos.flatten().tolist()) if eos is not None else frozenset(),
        tree_budget=tree_budget,
        max_draft_len=max_draft_len,
        do_sample=bool(generation_config.do_sample),
    )
    if drafters is not None:
        chosen = list(drafters)
    else:
        chosen = default_drafters(datastore, model, draft_tokenizer)
        if draft_learning:
            chosen.append(output_history(model))
    generator = None
    if options.do_sample:
        generator = torch.Generator(device="cpu")
        # Without a seed of its own, draw one from torch's global generator: that
        # respects (and advances) torch.manual_seed as HF sampling does.
        seed = draft_seed if draft_seed is not None else int(torch.randint(0, 2**62, (1,)))
        generator.manual_seed(seed)
    if draft_streamer is not None:
        draft_streamer.put(input_ids.cpu())
    planner = draft_planner
    if planner is None:
        rates = learned_rates(model, options.do_sample) if draft_learning else None
        planner = make_planner(model, tree_budget, adaptive_tree, rates)
    measured = planner.cost.skinny_sizes if planner.cost is not None else None
    new, stats = speculative_decode(
        TreeModel(model, skinny_sizes=measured),
        input_ids,
        chosen,
        options,
        processor=logits_processor,
        generator=generator,
        on_tokens=(lambda tokens: draft_streamer.put(torch.from_numpy(tokens))) if draft_streamer else None,
        should_stop=_extra_stop_check(stopping_criteria),
        planner=planner,
    )
    if draft_streamer is not None:
        draft_streamer.end()
    if draft_stats is not None:
        draft_stats.__dict__.update(stats.__dict__)
    return torch.cat([input_ids, torch.from_numpy(new).to(input_ids.device)[None]], dim=1)


def make_planner(model, tree_budget: int, adaptive: bool, calibrators: dict | None = None) -> TreePlanner:
    """A tree planner: cost-aware when ``adaptive`` (curve measured once per model), else fixed size;
    ``calibrators`` as for ``TreePlanner``."""
    cost = MEASURED_COSTS.get(model) if adaptive else None
    return TreePlanner(max_nodes=tree_budget, cost=cost, calibrators=calibrators)


def default_drafters(datastore: str | None, model, tokenizer=None) -> list[Drafter]:
    """Prompt lookup, plus the datastore's drafters when a datastore path is given."""
    chosen: list[Drafter] = [PromptLookupDrafter()]
    if datastore is not None:
        from retrieval_draft.drafters.datastore import datastore_drafters

        chosen.extend(datastore_drafters(datastore, vocab_size=model.config.vocab_size, tokenizer=tokenizer))
    return chosen


def output_history(model) -> HistoryDrafter:
    """The output history the default drafters share for ``model`` in this process (created on first use).

    Calls are not synchronised: two generations running at once with one model
    may pair a prompt with the other's output in the history. That changes
    which drafts are offered, never what is generated.
    """
    history = OUTPUT_HISTORIES.get(model)
    if history is None:
        history = OUTPUT_HISTORIES[model] = HistoryDrafter()
    return history


def learned_rates(model, sampling: bool) -> dict:
    """Drafter name -> ``AcceptanceCalibrator`` shared by this process's calls with ``model``.

    Greedy and sampling calls keep separate rates: sampling accepts fewer
    draft tokens. Counts decay every step (``AcceptanceCalibrator.decay``), so
    the rates follow a change of workload within a few hundred steps. Like
    ``output_history``, not synchronised: concurrent calls may interleave
    their updates, which changes tree sizes, never outputs.
    """
    return LEARNED_RATES.setdefault(model, {}).setdefault(bool(sampling), {})


def _extra_stop_check(stopping_criteria):
    """A per-token check for stopping criteria beyond max length and EOS, or None.

    The engine enforces max length and EOS itself; anything else (stop
    strings, max time, user criteria) is asked after each new token.
    """
    extra = [c for c in (stopping_criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
    if not extra:
        return None

    def should_stop(sequence: np.ndarray) -> bool:
        ids = torch.from_numpy(sequence).unsqueeze(0)
        return any(bool(criterion(ids, None).all()) for criterion in extra)

    return should_stop
