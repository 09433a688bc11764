"""One architecture's coverage check: plain greedy ``generate`` against the plugin on a tiny model.

The prompt is a random 12-token block repeated 4 times (48 tokens, past the
8-token window ``model_zoo.tiny_model`` sets), so prompt lookup drafts the
continuation and sliding or chunked layers see the window cut. Whether a
random model's greedy output follows the block is chance (one block in the
first run of issue 23 left 11 models accepting nothing), so up to
``len(PROMPT_SEEDS)`` blocks are tried, in order, until drafts are accepted;
the output must be identical on every block tried. ``check`` returns an
``Outcome`` whose ``result`` is one of ``RESULTS``; it never raises for a
model's failure, it records it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

import retrieval_draft
from retrieval_draft.errors import UnsupportedModelError
from retrieval_draft.memory import PluginMemory
from retrieval_draft.target.attention_layout import attention_layout
from tests.model_zoo import FIRST_PROMPT_ID, ZooBuildError, set_aside_reason, tiny_model

BLOCK, REPEATS, NEW_TOKENS, TREE_BUDGET = 12, 4, 24, 12
WINDOW = 8
PROMPT_SEEDS = (0, 1, 2)

IDENTICAL, REFUSED, SET_ASIDE, NOT_BUILT = "identical", "refused", "set aside", "not built"
PLAIN_FAILED, DIFFERS, CRASHED, NO_ACCEPTS = "plain generate failed", "differs", "crashed", "no drafts accepted"
RESULTS = (IDENTICAL, REFUSED, SET_ASIDE, NOT_BUILT, PLAIN_FAILED, DIFFERS, CRASHED, NO_ACCEPTS)


@dataclass
class Outcome:
    """What one architecture did.

    Attributes:
        model_type, class_name: the auto-mapping entry.
        result: one of ``RESULTS``.
        detail: the reason or error message ('' when identical).
        window: the window kind of the tiny model ('' when none was built).
        mode: 'tree' or 'chain' (how the plugin verified drafts; '' when it did not run).
        tokens_per_step: tokens emitted per verification step, bonus included (0.0 when it did not run).
        prompts: how many prompt blocks were run.
        seconds: wall time of the check.
    """

    model_type: str
    class_name: str
    result: str
    detail: str = ""
    window: str = ""
    mode: str = ""
    tokens_per_step: float = 0.0
    prompts: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        """Plain values for JSON."""
        return asdict(self)


def repeated_prompt(vocab_size: int, seed: int = 0) -> torch.Tensor:
    """Shape (1, BLOCK * REPEATS): one random block of ids in [FIRST_PROMPT_ID, min(vocab, 300)), repeated."""
    generator = torch.Generator().manual_seed(seed)
    block = torch.randint(FIRST_PROMPT_ID, min(vocab_size, 300), (BLOCK,), generator=generator)
    return block.repeat(REPEATS).unsqueeze(0)


def _one_line(error: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters."""
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:300]


def _first_difference(expected: torch.Tensor, got: torch.Tensor) -> str:
    """Where two outputs part (lengths included)."""
    a, b = expected[0].tolist(), got[0].tolist()
    index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"first difference at token {index} (lengths {len(a)} vs {len(b)})"


def _plain(model, prompt: torch.Tensor) -> torch.Tensor:
    """transformers' own greedy decoding: shape (1, L + NEW_TOKENS) at most."""
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)


def run_prompt(model, prompt: torch.Tensor, outcome: Outcome) -> Outcome:
    """The plugin, then plain greedy generate, on one prompt; fills ``outcome``.

    The plugin gets a memory of its own, kept off disk, so no earlier call
    (another prompt, another model) shapes its drafts. It runs first so a refusal costs no plain run; a plugin crash is
    reported as ``PLAIN_FAILED`` when transformers' own generate fails too.
    Never raises for a model's failure.
    """
    stats = retrieval_draft.DecodeStats()
    try:
        got = model.generate(
            prompt, max_new_tokens=NEW_TOKENS, custom_generate=retrieval_draft.generate,
            adaptive_tree=False, tree_budget=TREE_BUDGET, draft_stats=stats, draft_memory=PluginMemory(persist=False),
        )
    except UnsupportedModelError as error:
        outcome.result, outcome.detail = REFUSED, str(error)
        return outcome
    except Exception as error:  # a crash is a finding: record it
        got, outcome.result, outcome.detail = None, CRASHED, _one_line(error)
    try:
        expected = _plain(model, prompt)
    except Exception as error:  # the harness records any failure of transformers' own generate
        outcome.result, outcome.detail = PLAIN_FAILED, _one_line(error)
        return outcome
    if got is None:
        return outcome
    outcome.mode = attention_layout(model).mode
    outcome.tokens_per_step = round(stats.step_tokens / stats.steps, 3) if stats.steps else 0.0
    if not torch.equal(got, expected):
        outcome.result, outcome.detail = DIFFERS, _first_difference(expected, got)
    elif outcome.tokens_per_step <= 1.0:
        outcome.result = NO_ACCEPTS
    else:
        outcome.result = IDENTICAL
    return outcome


def run_model(model, model_type: str, class_name: str, window: str) -> Outcome:
    """``run_prompt`` on the blocks of ``PROMPT_SEEDS`` in turn, until one ends other than in ``NO_ACCEPTS``."""
    vocab = model.config.get_text_config().vocab_size
    outcome = Outcome(model_type, class_name, NO_ACCEPTS, window=window)
    for seed in PROMPT_SEEDS:
        outcome.prompts += 1
        if run_prompt(model, repeated_prompt(vocab, seed), outcome).result != NO_ACCEPTS:
            break
    return outcome


def check(model_type: str, class_name: str) -> Outcome:
    """The whole check for one auto-mapping entry: set aside, not built, or run."""
    start = time.perf_counter()
    reason = set_aside_reason(model_type, class_name)
    if reason is not None:
        return Outcome(model_type, class_name, SET_ASIDE, reason)
    try:
        model, window = tiny_model(model_type, window=WINDOW)
    except ZooBuildError as error:
        outcome = Outcome(model_type, class_name, NOT_BUILT, str(error))
    else:
        outcome = run_model(model, model_type, class_name, window)
    outcome.seconds = round(time.perf_counter() - start, 2)
    return outcome
