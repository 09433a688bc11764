"""One architecture's coverage check: plain greedy ``generate`` against the plugin on a tiny model.

The prompt is a random 12-token block repeated 4 times (48 tokens, past the
8-token window ``zoo_models.tiny_model`` sets), so prompt lookup drafts the
continuation and sliding or chunked layers see the window cut. Whether a
random model's greedy output follows the block is chance (one block in the
first run of issue 23 left 11 models accepting nothing), so up to
``len(PROMPT_SEEDS)`` blocks are tried, in order, until drafts are accepted;
the output must be identical on every block tried, tokens and logits (within
``LOGIT_TOLERANCE``). ``check`` returns an
``Outcome`` whose ``result`` is one of ``RESULTS``; it never raises for a
model's failure, it records it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import numba
import torch

import retrieval_draft
from retrieval_draft.errors import UnsupportedModelError
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.model.attention_layout import attention_layout
from tests.model.zoo_models import FIRST_PROMPT_ID, ZooBuildError, set_aside_reason, tiny_model

BLOCK, REPEATS, NEW_TOKENS, TREE_BUDGET = 12, 4, 24, 12
WINDOW = 8
PROMPT_SEEDS = (0, 1, 2)
# Largest |plugin - plain| logit, relative to max(1, largest |logit|), still counted as rounding. In float32
# the 105 tiny models that ran in issue 23 were within 6e-6; a window applied at the wrong positions
# (GPT-Neo's local layers read as full attention) was 0.23 apart with the same tokens.
LOGIT_TOLERANCE = 1e-4
_WITH_LOGITS = {"return_dict_in_generate": True, "output_logits": True}

IDENTICAL, REFUSED, SET_ASIDE, NOT_BUILT = "identical", "refused", "set aside", "not built"
PLAIN_FAILED, DIFFERS, CRASHED, NO_ACCEPTS = "plain generate failed", "differs", "crashed", "no drafts accepted"
LOGITS_DIFFER = "logits differ"
RESULTS = (IDENTICAL, REFUSED, SET_ASIDE, NOT_BUILT, PLAIN_FAILED, DIFFERS, LOGITS_DIFFER, CRASHED, NO_ACCEPTS)


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
        logit_gap: the largest ``logit_gap`` over the prompts run (0.0 when none compared logits).
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
    logit_gap: float = 0.0
    prompts: int = 0
    seconds: float = 0.0


@contextmanager
def one_numba_thread():
    """Within the block, the engine's Numba kernels run on the calling thread only.

    On two cores, Numba's OpenMP worker spins after each parallel kernel and takes
    CPU from the next torch op: measured on a tiny Qwen2 (24 new tokens), plain
    ``generate`` went from 0.10 s to 0.40 s of CPU once the plugin had run, and the
    plugin took 0.82 s instead of 0.10 s. Results do not depend on the thread count
    (``skinny_matmul`` sums each output element on one thread).
    """
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


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


def _plain(model, prompt: torch.Tensor):
    """transformers' own greedy decoding: ``sequences`` (1, L + NEW_TOKENS at most) and ``logits``."""
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, **_WITH_LOGITS)


def logit_gap(expected: tuple, got: tuple) -> float:
    """Largest |plugin - plain| raw logit over the emitted tokens, over max(1, largest |plain logit|)."""
    pairs = list(zip(expected, got))
    gap = max(float((e.float() - g.float()).abs().max()) for e, g in pairs)
    return gap / max(1.0, max(float(e.float().abs().max()) for e, _ in pairs))


def run_prompt(model, prompt: torch.Tensor) -> tuple[str, str, float, float]:
    """The plugin, then plain greedy generate, on one prompt: (result, detail, tokens per step, ``logit_gap``).

    The plugin gets a memory of its own, kept off disk, so no earlier call
    (another prompt, another model) shapes its drafts. It runs first so a
    refusal costs no plain run; a plugin crash is reported as ``PLAIN_FAILED``
    when transformers' own generate fails too. Identical tokens with logits
    further apart than ``LOGIT_TOLERANCE`` are ``LOGITS_DIFFER``: a wrong mask
    can keep the argmax on a tiny random model. Never raises for a model's failure.
    """
    stats = retrieval_draft.DecodeStats()
    try:
        got = model.generate(
            prompt, max_new_tokens=NEW_TOKENS, custom_generate=retrieval_draft.generate,
            adaptive_tree=False, tree_budget=TREE_BUDGET, draft_stats=stats, draft_memory=PluginMemory(persist=False),
            **_WITH_LOGITS,
        )
    except UnsupportedModelError as error:
        return REFUSED, str(error), 0.0, 0.0
    except Exception as error:  # a crash is a finding: record it
        got, crash = None, _one_line(error)
    try:
        expected = _plain(model, prompt)
    except Exception as error:  # the harness records any failure of transformers' own generate
        return PLAIN_FAILED, _one_line(error), 0.0, 0.0
    if got is None:
        return CRASHED, crash, 0.0, 0.0
    per_step = round(stats.step_tokens / stats.steps, 3) if stats.steps else 0.0
    if not torch.equal(got.sequences, expected.sequences):
        return DIFFERS, _first_difference(expected.sequences, got.sequences), per_step, 0.0
    gap = logit_gap(expected.logits, got.logits)
    if gap > LOGIT_TOLERANCE:
        return LOGITS_DIFFER, f"same tokens, logits {gap:.1e} apart (tolerance {LOGIT_TOLERANCE:.0e})", per_step, gap
    return (IDENTICAL if per_step > 1.0 else NO_ACCEPTS), "", per_step, gap


def run_model(model, outcome: Outcome) -> Outcome:
    """``run_prompt`` on the blocks of ``PROMPT_SEEDS`` in turn; fills and returns ``outcome``.

    Stops at the first prompt that differs (tokens or logits), crashes or is
    refused, and at the first with drafts accepted. The
    result is ``IDENTICAL`` when every prompt run was identical and one had
    drafts accepted; its tokens per step are those of the first such prompt.
    """
    vocab = model.config.get_text_config().vocab_size
    for seed in PROMPT_SEEDS:
        outcome.prompts += 1
        result, detail, per_step, gap = run_prompt(model, repeated_prompt(vocab, seed))
        outcome.logit_gap = max(outcome.logit_gap, gap)
        if result not in (IDENTICAL, NO_ACCEPTS):
            seen_on = f" (prompt seed {seed})" if result in (DIFFERS, LOGITS_DIFFER, CRASHED) else ""
            outcome.result, outcome.detail, outcome.tokens_per_step = result, detail + seen_on, per_step
            break
        if outcome.result != IDENTICAL:
            outcome.result, outcome.tokens_per_step = result, per_step
        if outcome.result == IDENTICAL:
            break
    if outcome.result in (IDENTICAL, NO_ACCEPTS, DIFFERS, LOGITS_DIFFER):
        outcome.mode = attention_layout(model).mode
    return outcome


def check(model_type: str, class_name: str) -> Outcome:
    """The whole check for one auto-mapping entry: set aside, not built, or ``run_model``."""
    start = time.perf_counter()
    reason = set_aside_reason(model_type, class_name)
    if reason is not None:
        return Outcome(model_type, class_name, SET_ASIDE, reason)
    try:
        model, window = tiny_model(model_type, window=WINDOW)
    except ZooBuildError as error:
        outcome = Outcome(model_type, class_name, NOT_BUILT, str(error))
    else:
        outcome = run_model(model, Outcome(model_type, class_name, NO_ACCEPTS, window=window))
    outcome.seconds = round(time.perf_counter() - start, 2)
    return outcome
