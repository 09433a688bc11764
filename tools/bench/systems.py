"""The systems the benchmark compares, each one timed call of ``model.generate``.

Three kinds:

- ``hf``: HF's own ``generate`` (greedy: the baseline of every speedup),
  HF's prompt lookup, and HF's static cache (``hf_compiled``:
  ``cache_implementation="static"``, which HF compiles on a GPU, its CUDA graphs included;
  one untimed warm-up call, timed apart, before the prompts).
- ``readme``: exactly the README's lines, default options, nothing the user
  would not pass (``draft_stats=``, documented, is the one addition)::

      model.generate(**inputs, max_new_tokens=N, custom_generate=retrieval_draft.generate)
      model.generate(**inputs, max_new_tokens=N, custom_generate=retrieval_draft.generate,
                     datastore="my-store", draft_tokenizer=tokenizer)

  So the plugin chooses the drafters (prompt lookup, the model's output
  history and logits-recycling table, + the store's drafters), opens the store from its path and
  measures or loads its cost curve itself, inside the timed calls.
- ``diagnostic``: explicit ``drafters=[...]`` that no README line passes,
  to explain the numbers (prompt lookup alone, the defaults without logits
  recycling, a warm history, the oracle), and the README call with
  ``tree_budget=0`` (our forward, no drafts: the base of the drafting share).
  ``static`` is the README call with ``cache_implementation="static"`` (documented in
  docs/options.md: fixed tree widths, compiled where HF compiles); its drafting share is over
  ``static_budget0``, the same call with ``tree_budget=0``.
- ``peer``: another project's drafter running in our engine through the README
  call's ``drafters=`` (SuffixDecoding, ``tools.bench.peers``), so drafting
  quality is compared on the same verifier, planner and model.

Every system gets the same prompt ids, ``max_new_tokens`` and decoding mode
(greedy, or sampling at one temperature after ``torch.manual_seed(seed)``);
only the drafting differs. A run's wall time covers the ``generate`` call
alone; model loading and tokenization are outside it.
"""

from __future__ import annotations

import copy
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import retrieval_draft
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.draft import Drafter
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.drafters.oracle import OracleDrafter
from retrieval_draft.drafters.registry import DraftSources, make_drafters
from retrieval_draft.plugin.hf import output_history
from retrieval_draft.sessions.memory import PROCESS_MEMORY
from retrieval_draft.planning.timing import synchronize
from tools.bench import peers

HF_PROMPT_LOOKUP_TOKENS = 10
KINDS = ("hf", "readme", "diagnostic", "peer")


@dataclass(frozen=True)
class RunSetup:
    """What every system of one timed run shares.

    Attributes:
        model: the causal LM, or (for our systems) a handle on it (``ModelHandles``).
        input_ids: shape (1, L), int64, the prompt.
        max_new_tokens: generation budget.
        sampling: ``generate`` sampling kwargs (temperature, ...); empty = greedy.
        seed: torch seed set before the call, the same for every system of the run.
        reference: shape (L + m,), int64, HF greedy's full output (for the oracle), or None.
        datastore: the ``datastore=`` value: the ``--datastore`` path string exactly as given, for
            repo workloads ``[repo store, that path]`` (``readme_datastore``), or None.
        tokenizer: the tokenizer (``draft_tokenizer=`` of the datastore line).
        plugin_kwargs: options set on the command line (tree_budget=, max_draft_len=); empty by default.
        history: a saved output history (``retrieval-draft generate --history FILE`` saves one), or None. Every
            run loads its own copy, so what one run generates never reaches another.
        datastore_b: a second datastore path (``--datastore-b``) for comparing two stores
            of the same corpus side by side (e.g. two format versions), or None; for repo
            workloads ``[repo store, that path]``.
    """

    model: torch.nn.Module
    input_ids: torch.Tensor
    max_new_tokens: int
    sampling: dict
    seed: int
    reference: np.ndarray | None
    datastore: str | list[str] | None
    tokenizer: object
    plugin_kwargs: dict
    history: Path | None = None
    datastore_b: str | list[str] | None = None


def readme_datastore(repo_store: str | None, general: str | None) -> str | list[str] | None:
    """What the datastore systems pass as ``datastore=``: the ``--datastore`` path as given, or,
    for a prompt with a repo store, ``[repo_store, general]``; None without a general store
    (those systems are then unavailable)."""
    if general is None:
        return None
    return [repo_store, general] if repo_store is not None else general


@dataclass(frozen=True)
class RunResult:
    """One timed call: the full output (shape (1, L + m)), wall seconds, our statistics or None."""

    output: torch.Tensor
    wall_s: float
    stats: DecodeStats | None


@dataclass(frozen=True)
class System:
    """A named way to generate.

    ``kind`` is one of ``KINDS``; ``drafters`` builds the explicit drafter list
    of a diagnostic (None for the others); ``hf_kwargs`` go to HF's generate;
    ``readme_datastore`` adds ``datastore=PATH, draft_tokenizer=tokenizer``, PATH
    being the second store when ``second_store``; ``plugin_kwargs`` adds our options
    (``tree_budget=0``).
    """

    name: str
    label: str
    kind: str
    hf_kwargs: dict | None = None
    drafters: Callable[[RunSetup], list[Drafter]] | None = None
    readme_datastore: bool = False
    plugin_kwargs: dict | None = None
    second_store: bool = False
    needs_reference: bool = False
    needs_history: bool = False

    @property
    def needs_datastore(self) -> bool:
        return self.readme_datastore


def _prompt(setup: RunSetup) -> list[Drafter]:
    return make_drafters(["prompt"], DraftSources())


def _no_recycling(setup: RunSetup) -> list[Drafter]:
    """The defaults without a datastore, less logits recycling: prompt lookup + the handle's history."""
    sources = DraftSources(history=output_history(setup.model))
    return make_drafters(["prompt", "history"], sources)


def _history(setup: RunSetup) -> list[Drafter]:
    history = HistoryDrafter.load(setup.history, vocab_size=setup.model.config.vocab_size)
    return make_drafters(["prompt", "history"], DraftSources(history=history))


# One SuffixDecoding cache per model handle (system, workload, repeat), as our output history is
# kept per handle: its global tree of earlier outputs serves that workload's later prompts.
_SUFFIX_CACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _suffix_decoding(setup: RunSetup) -> list[Drafter]:
    """SuffixDecoding alone, as vLLM's ``suffix`` method drafts (``tools.bench.peers``)."""
    if setup.model not in _SUFFIX_CACHES:
        _SUFFIX_CACHES[setup.model] = peers.SuffixDecodingDrafter(peers.suffix_cache_class())
    return [_SUFFIX_CACHES[setup.model]]


def _oracle(setup: RunSetup) -> list[Drafter]:
    """The clairvoyant ceiling: a diagnostic outside the drafter registry."""
    return [OracleDrafter(setup.reference)]


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("hf", "HF generate", "hf", hf_kwargs={}),
        System("hf_pld", f"HF prompt lookup ({HF_PROMPT_LOOKUP_TOKENS})", "hf",
               hf_kwargs={"prompt_lookup_num_tokens": HF_PROMPT_LOOKUP_TOKENS}),
        System("hf_compiled", "HF static cache (compiled on a GPU)", "hf", hf_kwargs={"cache_implementation": "static"}),
        System("defaults", "ours: defaults (README call)", "readme"),
        System("datastore", "ours: datastore= (README call)", "readme", readme_datastore=True),
        System("budget0", "diagnostic: tree_budget=0 (our forward, no drafts)", "diagnostic",
               plugin_kwargs={"tree_budget": 0}),
        System("static", "ours: cache_implementation='static' (README call)", "readme",
               plugin_kwargs={"cache_implementation": "static"}),
        System("static_budget0", "diagnostic: static, tree_budget=0", "diagnostic",
               plugin_kwargs={"cache_implementation": "static", "tree_budget": 0}),
        System("suffix", "peer: SuffixDecoding in our engine", "peer", drafters=_suffix_decoding),
        System("datastore_b", "ours: datastore= second store (README call)", "readme", readme_datastore=True,
               second_store=True),
        System("prompt", "diagnostic: drafters=[prompt lookup]", "diagnostic", drafters=_prompt),
        System("no_recycle", "diagnostic: defaults less logits recycling", "diagnostic", drafters=_no_recycling),
        System("history", "diagnostic: drafters=[prompt lookup, warm history]", "diagnostic",
               drafters=_history, needs_history=True),
        System("oracle", "diagnostic: oracle ceiling", "diagnostic", drafters=_oracle, needs_reference=True),
    )
}


def generate_kwargs(system: System, setup: RunSetup, stats: DecodeStats | None = None) -> dict:
    """The keyword arguments of ``system``'s ``model.generate`` call (besides the prompt ids).

    HF systems pass ``do_sample`` explicitly, as the README's comparison line
    does; our README systems pass only what the README shows (greedy is the
    model's default), plus ``draft_stats=stats`` when given.
    """
    kwargs = {"attention_mask": torch.ones_like(setup.input_ids), "max_new_tokens": setup.max_new_tokens}
    if setup.sampling:
        kwargs.update(do_sample=True, **setup.sampling)
    if system.kind == "hf":
        kwargs.setdefault("do_sample", False)
        return {**kwargs, **system.hf_kwargs}
    kwargs.update({**setup.plugin_kwargs, **(system.plugin_kwargs or {})}, custom_generate=retrieval_draft.generate)
    if system.readme_datastore:
        path = setup.datastore_b if system.second_store else setup.datastore
        kwargs.update(datastore=path, draft_tokenizer=setup.tokenizer)
    if system.drafters is not None:
        kwargs["drafters"] = system.drafters(setup)
    if stats is not None:
        kwargs["draft_stats"] = stats
    return kwargs


def run_system(system: System, setup: RunSetup) -> RunResult:
    """One timed ``generate`` call of ``system``, after ``torch.manual_seed(setup.seed)``."""
    stats = None if system.kind == "hf" else DecodeStats()
    kwargs = generate_kwargs(system, setup, stats)
    torch.manual_seed(setup.seed)
    synchronize(setup.input_ids.device)
    started = time.perf_counter()
    output = setup.model.generate(setup.input_ids, **kwargs)
    synchronize(setup.input_ids.device)
    wall = time.perf_counter() - started
    return RunResult(output.detach().cpu(), wall, stats)


class ModelHandles:
    """One handle on the model per (our system, workload, repeat): a shallow copy sharing the weights.

    The plugin remembers per model object (cost curve, learned acceptance
    rates, output history). A handle per (system, workload, repeat) makes that
    memory exactly what one process serving that workload's prompts in order
    would have: its own earlier calls, never the same prompt's output from
    another system or repeat, nor another workload's (code_chat asks the
    HumanEval tasks of code_raw). One-off costs of a new model object (the
    cost curve, unless the plugin finds it on disk) fall in the handle's first
    timed call. Opened datastores are per process, as the plugin keeps them.
    HF systems use the model itself.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._handles: dict[tuple[str, str, int], torch.nn.Module] = {}

    def get(self, system: System, workload: str, repeat: int) -> torch.nn.Module:
        """The model object ``system`` calls ``generate`` on in this workload and repeat."""
        if system.kind == "hf":
            return self.model
        key = (system.name, workload, repeat)
        if key not in self._handles:
            self._handles[key] = copy.copy(self.model)
        return self._handles[key]

    def planning(self, sizes=(1, 2, 3, 4, 8, 16, 32)) -> dict:
        """What each handle's planner priced trees by at the end of the run (the README line's
        memory, ``PROCESS_MEMORY``), keyed ``"system/workload/repeat"``: the cost curve's ms for a
        forward over each of ``sizes`` new tokens (None before one is measured) and, per band of
        tree sizes (``ObservedCost.BANDS``), the ratio of observed to curve time for one row
        below 1k cached tokens and how many forwards it saw; and, per drafter, the calibrated
        acceptance of a draft's first token at each raw-probability bucket's centre (greedy)."""
        out = {}
        for (system, workload, repeat), handle in self._handles.items():
            if not PROCESS_MEMORY.knows(handle):
                continue
            memory = PROCESS_MEMORY.model(handle)
            curve = None
            if memory.cost is not None:
                seconds = memory.cost.seconds
                curve = {str(n): round(1000 * float(seconds[min(n, memory.cost.max_nodes)]), 3) for n in sizes}
            observed = memory.observed
            out[f"{system}/{workload}/{repeat}"] = {
                "curve_ms": curve,
                "observed_bands": [int(band) for band in observed.BANDS],
                "observed_ratio": [round(float(r), 3) for r in observed.ratio[0, 0]],
                "observed_count": [int(c) for c in observed.count[0, 0]],
                "first_token_rates": {
                    name: [round(float(r), 3) for r in calibrator.rates(calibrator.centers, np.zeros_like(calibrator.centers, dtype=np.int64))]
                    for name, calibrator in memory.rates[False].items()
                },
            }
        return out


def prefill_seconds(model: torch.nn.Module, input_ids: torch.Tensor, tries: int = 3) -> float:
    """Fastest of ``tries`` forward passes over the prompt: the prefill every system pays."""
    best = float("inf")
    with torch.inference_mode():
        for _ in range(tries):
            synchronize(input_ids.device)
            started = time.perf_counter()
            model(input_ids, logits_to_keep=1)
            synchronize(input_ids.device)
            best = min(best, time.perf_counter() - started)
    return best


def unavailable_reason(system: System, has_datastore: bool, sampling: bool, has_history: bool = False,
                       has_datastore_b: bool = False) -> str | None:
    """Why ``system`` cannot run in this configuration, or None when it can."""
    if system.kind == "peer":
        return peers.unavailable()
    if system.second_store and not has_datastore_b:
        return "no second datastore (--datastore-b)"
    if system.needs_datastore and not has_datastore:
        return "no datastore"
    if system.needs_history and not has_history:
        return "no history file (--history)"
    if system.needs_reference and sampling:
        return "n/a (sampling)"
    return None
