"""The systems the benchmark compares, each one timed call of ``model.generate``.

Every system gets the same prompt ids, the same ``max_new_tokens`` and the
same decoding mode (greedy, or sampling at one temperature with one seed);
only the drafting differs. A run's wall time covers the ``generate`` call
alone; model loading, tokenization and warm-up are outside it.
"""

from __future__ import annotations

import time
from pathlib import Path
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from retrieval_draft.drafters.base import Drafter
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.drafters.oracle import OracleDrafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.engine import DecodeStats
from retrieval_draft.hf import generate as plugin_generate

HF_PROMPT_LOOKUP_TOKENS = 10


@dataclass(frozen=True)
class RunSetup:
    """What every system of one timed run shares.

    Attributes:
        model: the causal LM.
        input_ids: shape (1, L), int64, the prompt.
        max_new_tokens: generation budget.
        sampling: ``generate`` sampling kwargs (temperature, ...); empty = greedy.
        seed: sampling seed, the same for every system of the run.
        reference: shape (L + m,), int64, HF greedy's full output (for the oracle), or None.
        datastore: datastore drafters by name ("ngram", "suffix"); empty without a datastore.
        plugin_kwargs: extra options for our plugin (tree_budget=, max_draft_len=).
        history: a saved output history (``tools/warm_history.py``), or None. Every
            run loads its own copy, so what one run generates never reaches another.
    """

    model: torch.nn.Module
    input_ids: torch.Tensor
    max_new_tokens: int
    sampling: dict
    seed: int
    reference: np.ndarray | None
    datastore: dict
    plugin_kwargs: dict
    history: Path | None = None


@dataclass(frozen=True)
class RunResult:
    """One timed call: the full output (shape (1, L + m)), wall seconds, our statistics or None."""

    output: torch.Tensor
    wall_s: float
    stats: DecodeStats | None


@dataclass(frozen=True)
class System:
    """A named way to generate. ``drafters`` builds our drafter list; None means plain HF."""

    name: str
    label: str
    needs_datastore: bool
    needs_reference: bool
    drafters: Callable[[RunSetup], list[Drafter]] | None
    hf_kwargs: dict
    needs_history: bool = False
    plugin_options: dict | None = None  # extra keyword arguments for our plugin


def _prompt(setup: RunSetup) -> list[Drafter]:
    return [PromptLookupDrafter()]


def _ngram(setup: RunSetup) -> list[Drafter]:
    return [setup.datastore["ngram"]]


def _suffix(setup: RunSetup) -> list[Drafter]:
    return [setup.datastore["suffix"]]


def _all(setup: RunSetup) -> list[Drafter]:
    return [PromptLookupDrafter(), setup.datastore["ngram"], setup.datastore["suffix"]]


def _warm_history(setup: RunSetup) -> HistoryDrafter:
    return HistoryDrafter.load(setup.history, vocab_size=setup.model.config.vocab_size)


def _history(setup: RunSetup) -> list[Drafter]:
    return [PromptLookupDrafter(), _warm_history(setup)]


def _all_history(setup: RunSetup) -> list[Drafter]:
    return [*_all(setup), _warm_history(setup)]


def _oracle(setup: RunSetup) -> list[Drafter]:
    return [OracleDrafter(setup.reference)]


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("hf", "HF generate", False, False, None, {}),
        System(
            "hf_pld",
            f"HF prompt lookup ({HF_PROMPT_LOOKUP_TOKENS})",
            False,
            False,
            None,
            {"prompt_lookup_num_tokens": HF_PROMPT_LOOKUP_TOKENS},
        ),
        System("prompt", "ours: prompt lookup", False, False, _prompt, {}),
        System(
            "prompt_fresh", "ours: prompt lookup, no learning across calls", False, False, _prompt, {},
            plugin_options={"draft_learning": False},
        ),
        System("ngram", "ours: n-gram table", True, False, _ngram, {}),
        System("suffix", "ours: suffix index", True, False, _suffix, {}),
        System("all", "ours: all drafters", True, False, _all, {}),
        System("history", "ours: prompt lookup + warm history", False, False, _history, {}, needs_history=True),
        System(
            "all_history", "ours: all drafters + warm history", True, False, _all_history, {}, needs_history=True
        ),
        System("oracle", "ours: oracle (ceiling)", False, True, _oracle, {}),
    )
}


def run_system(system: System, setup: RunSetup) -> RunResult:
    """One timed ``generate`` call of ``system``; sampling reseeds torch with ``setup.seed``."""
    common = {
        "attention_mask": torch.ones_like(setup.input_ids),
        "max_new_tokens": setup.max_new_tokens,
        "do_sample": bool(setup.sampling),
        **setup.sampling,
    }
    stats = None
    if system.drafters is None:
        kwargs = {**common, **system.hf_kwargs}
    else:
        stats = DecodeStats()
        kwargs = {
            **common,
            **setup.plugin_kwargs,
            **(system.plugin_options or {}),
            "custom_generate": plugin_generate,
            "drafters": system.drafters(setup),
            "draft_stats": stats,
            "draft_seed": setup.seed,
        }
    torch.manual_seed(setup.seed)
    started = time.perf_counter()
    output = setup.model.generate(setup.input_ids, **kwargs)
    wall = time.perf_counter() - started
    return RunResult(output.detach().cpu(), wall, stats)


def prefill_seconds(model: torch.nn.Module, input_ids: torch.Tensor, tries: int = 3) -> float:
    """Fastest of ``tries`` forward passes over the prompt: the prefill every system pays."""
    best = float("inf")
    with torch.inference_mode():
        for _ in range(tries):
            started = time.perf_counter()
            model(input_ids, logits_to_keep=1)
            best = min(best, time.perf_counter() - started)
    return best


def unavailable_reason(system: System, has_datastore: bool, sampling: bool, has_history: bool = False) -> str | None:
    """Why ``system`` cannot run in this configuration, or None when it can."""
    if system.needs_datastore and not has_datastore:
        return "no datastore"
    if system.needs_history and not has_history:
        return "no history file (--history)"
    if system.needs_reference and sampling:
        return "n/a (sampling)"
    return None
