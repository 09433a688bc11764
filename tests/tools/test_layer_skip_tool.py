"""tools.diagnostics.layer_skip: teacher-forced agreement, the exact self-speculation walk, and the removal search."""

from __future__ import annotations

import numpy as np
import torch

import tools.diagnostics.layer_skip as layer_skip
from tools.diagnostics.layer_skip import SkippedLayers, draft_step_seconds, greedy_removal, matches, predictions, reference, tokens_per_step

from tests.conftest import make_tiny_llama, random_prompt
from tests.stand_in_clocks import stepping_clock


def test_the_walk_counts_accepted_drafts_plus_the_bonus_token():
    hit = np.array([True, True, False, True, True, True, True])
    # chain 2: accept 2 + bonus (pos 0-2), accept 2 + bonus (3-5), then 1 token left: 3 steps
    assert tokens_per_step(hit, 2) == 7 / 3
    assert tokens_per_step(np.zeros(5, dtype=bool), 4) == 1.0  # every draft wrong: plain decoding
    assert tokens_per_step(np.ones(6, dtype=bool), 5) == 6.0  # one step drafts all five, the bonus ends it


def test_all_layers_agree_with_the_full_model_and_skipping_restores_them():
    model = make_tiny_llama()
    prompt = random_prompt(1, length=8)
    sequence = reference(model, prompt, 12)
    layers = list(model.model.layers)
    every = list(range(len(layers)))
    full = predictions(model, every, sequence, prompt.shape[1])
    assert torch.equal(full, sequence[0, prompt.shape[1]:])  # teacher forcing reproduces greedy decoding
    assert matches(model, every, (sequence, prompt.shape[1], full)).all()
    with SkippedLayers(model, [0]):
        assert len(model.model.layers) == 1
    assert list(model.model.layers) == layers


def test_the_search_removes_one_distinct_layer_per_round(monkeypatch):
    model = make_tiny_llama()
    sequences = [reference(model, random_prompt(seed, length=8), 10) for seed in range(2)]
    every = list(range(len(model.model.layers)))
    search = [(seq, 8, predictions(model, every, seq, 8)) for seq in sequences]
    path = greedy_removal(model, search, max_skip=1, log=lambda text: None)
    assert len(path) == 1 and path[0]["keep"] == [i for i in range(len(model.model.layers)) if i != path[0]["removed"]]
    assert 0.0 <= path[0]["search_agreement"] <= 1.0
    original = [layer.self_attn.layer_idx for layer in model.model.layers]
    monkeypatch.setattr(layer_skip, "time", stepping_clock(0.25))  # each timed forward: 0.25 s by this clock
    assert draft_step_seconds(model, path[0]["keep"], random_prompt(3, length=8), steps=3) == 0.25
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == original
