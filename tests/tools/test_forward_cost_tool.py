"""tools.diagnostics.forward_cost: each variant switches off what it names, and the tables fill."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

import tools.diagnostics.forward_cost as forward_cost
from retrieval_draft.model.kv_cache import GrowingLayer
from retrieval_draft.planning import cost_probe
from tools.diagnostics.forward_cost import VARIANTS, forward_table, markdown, matmul_table, prepared

from tests.conftest import make_tiny_llama, random_prompt
from tests.stand_in_clocks import FixedTimer, stepping_clock


def test_variants_switch_off_what_they_name():
    model = make_tiny_llama()
    prompt = random_prompt(0)
    stock = prepared(model, prompt, "stock")
    ours = prepared(model, prompt, "all")
    assert all(type(layer) is DynamicLayer for layer in stock.cache.layers)
    assert all(isinstance(layer, GrowingLayer) for layer in ours.cache.layers)
    for mine, theirs in zip(ours.cache.layers, stock.cache.layers):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
    assert not stock.grouped_attention and not prepared(model, prompt, "+kv_cache").grouped_attention
    assert prepared(model, prompt, "+attention").grouped_attention and ours.grouped_attention
    assert prepared(model, prompt, "+attention").skinny_sizes == frozenset() and ours.skinny_sizes


def test_tables_cover_every_variant_and_size_in_milliseconds_of_the_clocks_they_read(monkeypatch):
    """Stand-in clocks (each forward 125 ms; each matmul pass 250 ms): the tables report exactly those."""
    monkeypatch.setattr(cost_probe, "ForwardTimer", FixedTimer)
    monkeypatch.setattr(forward_cost, "time", stepping_clock(0.25))
    model = make_tiny_llama()
    forward = forward_table(model, contexts=[20], sizes=[1, 4], rounds=1, runs=1)
    matmul = matmul_table(model, rows_list=[1, 4], runs=3)
    assert set(forward[20]) == set(VARIANTS)
    assert all(table == {1: 125.0, 4: 125.0} for table in forward[20].values())
    assert matmul == {1: {"mkl": 250.0, "kernel": 250.0}, 4: {"mkl": 250.0, "kernel": 250.0}}
    assert "| 20 | stock | 125.0 | 125.0 |" in markdown(forward, matmul, [1, 4])
    assert "| 4 | 250.0 | 250.0 |" in markdown(forward, matmul, [1, 4])
