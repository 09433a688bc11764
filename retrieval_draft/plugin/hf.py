"""The HuggingFace ``generate`` plugin.

    model.generate(**inputs, custom_generate=retrieval_draft.generate, max_new_tokens=N)

returns what ``model.generate(**inputs, max_new_tokens=N)`` returns: the same
tensor under greedy decoding, the same distribution under sampling. Our
options travel as keyword arguments that ``generate`` hands through because
they appear in this function's signature.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from retrieval_draft.config import DEFAULTS, DraftConfig
from retrieval_draft.decode.engine import DecodeOptions, RowSinks, speculative_decode
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.draft import Drafter
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.drafters.recycling import RecyclingDrafter
from retrieval_draft.drafters.registry import DraftSources, default_names, make_drafters
from retrieval_draft.plugin.hf_options import ScoreRecorder, build_output, check_options, padded_sequences, score_recorder
from retrieval_draft.sessions.memory import PROCESS_MEMORY, PluginMemory
from retrieval_draft.planning.cost import stepped
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.plugin.keywords import plugin_keywords
from retrieval_draft.model.generate_kwargs import eos_token_ids, pad_token_id, receives_generate_kwargs
from retrieval_draft.model.row_processors import row_processors
from retrieval_draft.model.attention_layout import CHAIN
from retrieval_draft.model.prefix_cache import PrefixCache, ReuseReport
from retrieval_draft.model.static_shapes import StaticSteps, compiles, static_widths
from retrieval_draft.model.tree_model import TreeModel, context_limit, validate_inputs

if TYPE_CHECKING:
    from retrieval_draft.store.reader import Datastore


@receives_generate_kwargs
def generate(
    model,
    input_ids: torch.Tensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    tokenizer=None,
    assistant_model=None,
    drafters: Sequence[Drafter] | None = None,
    datastore: str | Path | Datastore | Sequence[str | Path | Datastore] | None = None,
    draft_tokenizer=None,
    draft_learning: bool = DEFAULTS.draft_learning,
    tree_budget: int = DEFAULTS.tree_budget,
    max_draft_len: int = DEFAULTS.max_draft_len,
    adaptive_tree: bool = DEFAULTS.adaptive_tree,
    draft_planner: TreePlanner | None = None,
    draft_streamer=None,
    draft_stats: DecodeStats | None = None,
    draft_seed: int | None = None,
    draft_memory: PluginMemory | None = None,
    prefix_cache_bytes: int = DEFAULTS.prefix_cache_bytes,
    **model_kwargs,
) -> torch.Tensor | GenerateDecoderOnlyOutput:
    """A ``custom_generate`` callable for ``model.generate``.

    Options ``generate`` cannot have honoured here (beams, several sequences,
    attentions, hidden states, other speculative methods: ``hf_options.check_options``)
    raise ``InvalidInputError`` before any model work. ``tokenizer`` (for
    ``stop_strings``), ``streamer`` and ``assistant_model`` are ``generate``'s own, passed on
    by ``model.generate_kwargs.receives_generate_kwargs``; an assistant model is refused.
    ``streamer`` (one sequence) receives what plain ``generate`` streams: the prompt (put by
    ``generate`` itself), every new token once, in order, then ``end()``.

    Args (ours; the rest come from ``generate``):
        drafters: registry names (``prompt``, ``ngram``, ...: a list, or a comma-separated
            string, as the command line's ``--drafters``) or drafter instances; default
            prompt lookup, the output history and logits recycling, plus the datastore's
            drafters when ``datastore`` is given. Every keyword of ours is checked, by type
            and range, before the prefill (``plugin.keywords``).
        datastore: path of a datastore built by ``retrieval-draft build`` or
            ``retrieval-draft repo`` (opened and verified once per process, re-opened
            when rebuilt), a store from ``retrieval_draft.open_datastore``, or a list
            of these (e.g. ``[repo_store, general_store]``): every store drafts, each
            store's drafters named apart so their acceptance is learned apart.
        draft_tokenizer: the tokenizer in use, to check the datastore's fingerprint
            (default: ``generate``'s own ``tokenizer=`` when given).
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
        draft_streamer: an HF streamer (``put``/``end``), as ``streamer=``; a batch takes
            a list of one streamer per row (each fed its row's prompt, new tokens and ``end``).
            Give one of ``streamer`` and ``draft_streamer``.
        draft_stats: a ``DecodeStats`` to fill in with this call's statistics.
        draft_seed: seed for sampling; the same seed gives the same output.
        prefix_cache_bytes: most bytes of KV rows kept per model, so that a later call whose
            prompt begins with an earlier call's prompt and output prefills only the rest
            (``retrieval_draft.model.prefix_cache``); 0 turns that off. A cache the caller prefilled and passed
            as ``past_key_values`` (HF's idiom) is started from too.

    A batch (several rows, or a padded attention mask; left padding) takes the same
    options: every row drafts and accepts on its own, all rows' trees share each
    forward, and the result equals HF's batched output (rows that stop early padded
    with ``pad_token_id``). There ``drafters`` may also be one list per row.

    Returns:
        shape (1, L + m) (a batch: (B, L + m)), the prompt followed by the new tokens; with
        ``return_dict_in_generate`` HF's ``GenerateDecoderOnlyOutput`` holding it as
        ``sequences``, plus ``scores`` / ``logits`` (m tensors of shape (1, V), a batch's
        (B, V)) when ``output_scores`` / ``output_logits`` ask for them.
    """
    check_options(generation_config, assistant_model, model)
    rows = input_ids.shape[0]
    ours = plugin_keywords(
        rows, drafters=drafters, datastore=datastore, draft_tokenizer=draft_tokenizer, tokenizer=tokenizer,
        draft_planner=draft_planner, streamer=streamer, draft_streamer=draft_streamer, draft_stats=draft_stats,
        draft_memory=draft_memory,
        tree_budget=tree_budget, max_draft_len=max_draft_len, adaptive_tree=adaptive_tree,
        draft_learning=draft_learning, draft_seed=draft_seed, prefix_cache_bytes=prefix_cache_bytes,
    )
    config = ours.config
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    validate_inputs(input_ids, attention_mask, model.config.vocab_size, context_limit(model))
    options = DecodeOptions(
        max_new_tokens=int(generation_config.max_length) - input_ids.shape[1],
        eos_ids=eos_token_ids(generation_config),
        max_draft_len=config.max_draft_len,
        do_sample=bool(generation_config.do_sample),
    )
    memory = ours.memory
    given = ours.drafters if ours.drafters is not None else [  # one menu, per-row handles
        default_drafters(ours.datastore, model, ours.tokenizer, memory, config.draft_learning, ours.names)
    ] * rows
    recorders = [score_recorder(generation_config, view) for view in row_processors(logits_processor, rows)]
    streamers = ours.streamers
    # One generation at a time per model: a tree forward switches the model's attention
    # function and linear layers for its duration, which another thread must not see.
    prefixes = memory.model(model).prefixes
    with memory.model(model).lock:
        tree_model = TreeModel(model)
        static = static_steps(model, generation_config, config.tree_budget if ours.planner is None
                              else ours.planner.tree_budget, memory)
        if static is not None:
            tree_model.use_static(static)
        tree_model.start_reuse(prefixes, config.prefix_cache_bytes, input_ids, attention_mask, model_kwargs)
        if ours.planner is None:  # one row verified as trees can measure the cost curve while it decodes
            can_probe = rows == 1 and tree_model.layout.mode != CHAIN and static is None
            planner = make_planner(model, config, options.do_sample, memory, can_probe,
                                   None if static is None else static.widths)
        else:
            planner = ours.planner
        widest = planner.tree_budget + 1 if static is None else static.widest
        tree_model.reserve = options.max_new_tokens + widest  # new tokens and one tree (the planner's)
        tree_model.row_by_row = planner.row_by_row  # the matmul loop measured on this machine, with the curve
        for row, row_streamer in enumerate(streamers):
            if row_streamer is not None and not ours.prompt_streamed:
                row_streamer.put(input_ids[row : row + 1, attention_mask[row].bool()].cpu())
        outputs, stats = speculative_decode(
            tree_model, input_ids.cpu(), given, options, attention_mask=attention_mask,
            planner=planner, processor=logits_processor,
            generator=_sampling_generator(config.draft_seed) if options.do_sample else None,
            should_stop=_extra_stop_check(stopping_criteria),
            sinks=[_sinks(row_streamer, recorder) for row_streamer, recorder in zip(streamers, recorders)],
        )
        _report_reuse(stats, tree_model.finish_reuse(input_ids, attention_mask, outputs), prefixes)
        for row_streamer in streamers:
            if row_streamer is not None:
                row_streamer.end()
        memory.after_call(model)
        if config.draft_learning and ours.planner is None:
            memory.save_learned(model)
    if ours.stats is not None:
        ours.stats.__dict__.update(stats.__dict__)
    sequences = padded_sequences(input_ids, outputs, pad_token_id(generation_config, options.eos_ids))
    return build_output(sequences, generation_config, recorders)


def prefill(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    draft_memory: PluginMemory | None = None,
    prefix_cache_bytes: int = DEFAULTS.prefix_cache_bytes,
) -> DecodeStats:
    """Read prompts into ``model``'s prefix cache without generating: a later ``generate`` call
    (``custom_generate=retrieval_draft.generate``) whose prompt begins with one of them reads only
    the rest. An editor calls it while its user types (llama.vim's cache warming); through
    ``retrieval-draft serve`` a request with ``max_tokens=0`` does it.

    Args:
        input_ids: (B, L) int64 prompts, left-padded.
        attention_mask: (B, L), 1 on real tokens (None: no padding).
        draft_memory: the ``PluginMemory`` whose cache to fill (default ``PROCESS_MEMORY``).
        prefix_cache_bytes: the cache's cap, as ``generate`` takes it (0 keeps nothing).

    Returns:
        the call's ``DecodeStats`` (``reused_tokens``, ``prefilled_tokens``, ``prefix_cache_bytes``).
    """
    ours = plugin_keywords(input_ids.shape[0], draft_memory=draft_memory, prefix_cache_bytes=prefix_cache_bytes)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    validate_inputs(input_ids, attention_mask, model.config.vocab_size, context_limit(model))
    prefixes = ours.memory.model(model).prefixes
    with ours.memory.model(model).lock:
        tree_model = TreeModel(model)
        tree_model.reserve = 1
        known = ours.memory.known_cost(model)  # the matmul loop measured on this machine, if a curve says
        tree_model.row_by_row = known is not None and known.row_by_row
        tree_model.start_reuse(prefixes, ours.config.prefix_cache_bytes, input_ids, attention_mask, {})
        logits = tree_model.prefill(input_ids, attention_mask)
        # the prefix cache keeps a sequence's first n - 1 tokens (the last emitted one has no rows yet):
        # the first token each row would emit closes the sequence, so the whole prompt is kept
        firsts = [np.array([token], dtype=np.int64) for token in logits.argmax(dim=-1).tolist()]
        stats = DecodeStats(rows=input_ids.shape[0])
        _report_reuse(stats, tree_model.finish_reuse(input_ids, attention_mask, firsts), prefixes)
    return stats


def static_steps(model, generation_config, tree_budget: int, memory: PluginMemory) -> StaticSteps | None:
    """The call's static-shape verification for ``cache_implementation="static"`` (else None): widths
    up to a tree of ``tree_budget`` draft nodes, the forward compiled where HF's own static cache
    compiles it (``static_shapes.compiles``; the compiled call kept per model and compile config by
    ``memory``); else the model runs eagerly at every width (padding a tree buys nothing without graphs
    to keep few, and costs a CPU the padded nodes' matmuls). The pool comes from the model's slab."""
    if generation_config.cache_implementation != "static":
        return None
    slab = memory.model(model).slab
    if not compiles(next(model.parameters()).device, generation_config):
        return StaticSteps(tuple(range(1, tree_budget + 2)), slab=slab)
    return StaticSteps(static_widths(tree_budget + 1), memory.compiled(model, generation_config.compile_config),
                       compiled=True, slab=slab)


def _report_reuse(stats: DecodeStats, report: ReuseReport, prefixes: PrefixCache) -> None:
    """Write what the prefill reused (``report``) and what the model's prefix cache holds into ``stats``."""
    stats.reused_tokens = report.reused
    stats.prefilled_tokens = report.prefilled
    stats.reuse_note = report.note
    stats.prefix_cache_bytes = prefixes.nbytes


def _sinks(streamer, recorder: ScoreRecorder | None) -> RowSinks:
    """One row's sinks: its streamer's ``put`` for new tokens, its recorder for scores and logits."""
    on_tokens = (lambda tokens: streamer.put(torch.from_numpy(tokens))) if streamer is not None else None
    return RowSinks(on_tokens=on_tokens, on_logits=recorder)


def _sampling_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with ``seed``; without one, drawn from torch's global generator,
    which respects (and advances) ``torch.manual_seed`` as HF sampling does."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
    return generator


def make_planner(
    model, config: DraftConfig, sampling: bool, memory: PluginMemory = PROCESS_MEMORY, can_probe: bool = False,
    widths: tuple[int, ...] | None = None,
) -> TreePlanner:
    """A tree planner for one call: cost-aware when ``config.adaptive_tree`` (the model's
    curve from ``memory``, kept on disk across processes; where there is none yet, a call that
    ``can_probe`` measures it from its own forwards, ``PluginMemory.planning_cost``), else fixed
    size; with ``config.draft_learning`` it shares the model's learned rates, cost corrections
    and drafter gate. ``widths``: the static widths forwards run at (``static_shapes``), None for
    the dynamic cache: the curve then prices a tree at the width it is padded to (``stepped``), and
    the forward times the call observes correct it apart from the default path's (a compiled forward
    is far cheaper than the eager one the curve was measured on, and must not lower the kept curve)."""
    cost, probe = memory.planning_cost(model, can_probe) if config.adaptive_tree else (None, None)
    if cost is not None and widths is not None:
        cost = stepped(cost, widths)
    if not config.draft_learning:
        return TreePlanner(tree_budget=config.tree_budget, cost=cost, probe=probe)
    learned = memory.model(model)
    return TreePlanner(
        tree_budget=config.tree_budget, cost=cost, calibrators=learned.rates[bool(sampling)], gate=learned.gate,
        observed=learned.observed if widths is None else learned.static_observed, ranks=learned.ranks[bool(sampling)],
        probe=probe,
    )


def default_drafters(
    datastore: str | Path | Datastore | Sequence[str | Path | Datastore] | None,
    model,
    tokenizer=None,
    memory: PluginMemory = PROCESS_MEMORY,
    learning: bool = DEFAULTS.draft_learning,
    names: Sequence[str] | None = None,
) -> list[Drafter]:
    """The registry's default menu: prompt lookup, every datastore's drafters when datastores
    (a path or opened store, or a list of them) are given, logits recycling (with ``learning``
    the model's table kept across calls, else a table this call fills) and with ``learning``
    the model's output history; or the drafters ``names`` (registry names) over those sources."""
    stores = ()
    if datastore is not None:  # the store's readers need datrie: imported only when a store is given
        from retrieval_draft.drafters.datastore import open_checked_stores

        stores = open_checked_stores(datastore, vocab_size=model.config.vocab_size, tokenizer=tokenizer, memory=memory)
    if learning:
        sources = DraftSources(stores=stores, history=memory.model(model).history, recycled=memory.recycled(model))
    else:
        sources = DraftSources(stores=stores, recycled=RecyclingDrafter(int(model.config.vocab_size)))
    return make_drafters(names or default_names(sources), sources)


def open_datastore(path: str | Path, memory: PluginMemory = PROCESS_MEMORY) -> Datastore:
    """The datastore at ``path``, opened and verified once per process and build.

    Pass the result as ``datastore=`` to skip even the per-call identity check
    (six ``stat`` calls). Raises CorruptDatastoreError, UnknownFormatVersionError,
    TokenIdOutOfRangeError for a bad store, before any of its files is parsed
    unverified.
    """
    return memory.stores.open(path)


def output_history(model) -> HistoryDrafter:
    """The output history the default drafters share for ``model`` in this process (created on first use).

    Calls are not synchronised: two generations running at once with one model
    may pair a prompt with the other's output in the history. That changes
    which drafts are offered, never what is generated.
    """
    return PROCESS_MEMORY.model(model).history


def learned_rates(model, sampling: bool) -> dict:
    """Drafter name -> ``AcceptanceCalibrator`` shared by this process's calls with ``model``.

    Greedy and sampling calls keep separate rates: sampling accepts fewer
    draft tokens. Counts decay every step (``AcceptanceCalibrator.decay``), so
    the rates follow a change of workload within a few hundred steps. Like
    ``output_history``, not synchronised: concurrent calls may interleave
    their updates, which changes tree sizes, never outputs.
    """
    return PROCESS_MEMORY.model(model).rates[bool(sampling)]


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
