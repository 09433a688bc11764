"""Sampling in a batch is lossless: each row's output follows the model's distribution exactly.

Batches of rows with two different prompts (different lengths, so the shorter
one's rows are left-padded; the prompts alternate, ``COPIES`` rows of each) go
through the whole batch engine: one prefill, depth-2 trees
scored together in one forward, per-row verification, per-row cache
compaction. Each row's four-token outputs are compared with that row's exact
distribution, computed by enumeration on its unpadded prompt; every row samples
from its own stream, so the rows of one prompt in one batch are independent draws
(``test_sampling_distribution``'s harness and bound), under HF's sampling
processors (repetition penalty, temperature, top-k). The negative control (a
sampler that re-samples from p after a rejection) goes through the same
harness and must exceed the bound.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import retrieval_draft
import retrieval_draft.decode.verify as readout
from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.model.tree_model import TreeModel
from tests.decode.test_sampling_distribution import (
    ENGINE_HORIZON,
    ENGINE_PROMPT,
    KnowingDrafter,
    empirical_tv,
    encode,
    engine_processor,
    exact_conditionals,
    exact_joint,
    make_model,
    resample_from_p,
    tv_bound,
)

# Row 1 is shorter (left-padded with id 0) and holds id 0 itself, so the repetition penalty,
# which sees the padded row as HF's batched generate shows it, is the same as on the bare prompt.
PROMPTS = (ENGINE_PROMPT, (0, 5, 7, 1))
RUNS = 2_000  # generations per prompt
CONTROL_RUNS = 1_000
COPIES = 25  # rows per prompt in one batch (the batch alternates the prompts); divides both counts


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def conditionals(model):
    return [exact_conditionals(model, prompt, ENGINE_HORIZON, engine_processor()) for prompt in PROMPTS]


def batch_inputs(copies: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), shape (copies * 2, L): row r holds ``PROMPTS[r % 2]``, left-padded with id 0."""
    length = max(len(p) for p in PROMPTS)
    ids = torch.zeros(len(PROMPTS) * copies, length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row in range(ids.shape[0]):
        prompt = PROMPTS[row % len(PROMPTS)]
        ids[row, length - len(prompt) :] = torch.tensor(prompt)
        mask[row, length - len(prompt) :] = 1
    return ids, mask


def batch_draws(model, runs: int, conditionals) -> list[np.ndarray]:
    """``runs`` generations of each prompt, ``COPIES`` of each per batch; per prompt, shape (runs, ENGINE_HORIZON)."""
    assert runs % COPIES == 0
    ids, mask = batch_inputs(COPIES)
    generator = torch.Generator().manual_seed(5)
    drafters = [[KnowingDrafter(cond, len(prompt), seed=6 + row)] for row, (cond, prompt) in enumerate(zip(conditionals, PROMPTS))]
    options = DecodeOptions(max_new_tokens=ENGINE_HORIZON, max_draft_len=2, do_sample=True)
    processor = engine_processor()
    out = [np.empty((runs, ENGINE_HORIZON), dtype=np.int64) for _ in PROMPTS]
    for start in range(0, runs, COPIES):
        planner = TreePlanner(tree_budget=8)
        outputs, _ = speculative_decode(
            TreeModel(model, skinny_sizes=frozenset()), ids, drafters * COPIES, options, mask, planner, processor,
            generator,
        )
        for prompt in range(len(PROMPTS)):
            out[prompt][start : start + COPIES] = np.stack(outputs[prompt :: len(PROMPTS)])
    return out


def test_each_row_of_a_sampled_batch_matches_its_exact_distribution(model, conditionals):
    draws = batch_draws(model, RUNS, conditionals)
    for row, cond in enumerate(conditionals):
        joint = exact_joint(cond)
        tv, bound = empirical_tv(encode(draws[row]), joint), tv_bound(joint, RUNS)
        print(f"batch prompt {row}: TV {tv:.4f} bound {bound:.4f}")
        assert tv < bound


def test_batch_with_resampling_from_p_exceeds_the_bound(model, conditionals, monkeypatch):
    monkeypatch.setattr(readout, "verify_sampling", resample_from_p)
    draws = batch_draws(model, CONTROL_RUNS, conditionals)
    joint = exact_joint(conditionals[0])
    tv, bound = empirical_tv(encode(draws[0]), joint), tv_bound(joint, CONTROL_RUNS)
    print(f"batch control: TV {tv:.4f} bound {bound:.4f}")
    assert tv > bound


def test_a_sampled_batch_through_generate_is_reproducible_by_seed(model):
    ids, mask = batch_inputs()
    model.generation_config.pad_token_id = 0

    def run(seed):
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=True, temperature=0.9,
                              custom_generate=retrieval_draft.generate, draft_seed=seed, eos_token_id=[])

    first, again, other = run(1), run(1), run(2)
    assert first.shape == (2, ids.shape[1] + 8)
    assert torch.equal(first[:, : ids.shape[1]], ids)
    assert torch.equal(first, again) and not torch.equal(first, other)
