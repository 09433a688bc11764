"""The in-place KV cache: same rows as HF's concatenating cache, through growth and compaction."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.cache_utils import DynamicLayer

from retrieval_draft.tree import DraftTree
from retrieval_draft.model.kv_cache import MIN_CAPACITY, GrowingLayer, KVPool, growing_cache, pooled
from retrieval_draft.model.tree_model import TreeModel

from tests.conftest import make_tiny_llama, random_prompt


def _rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, 4, generator=generator), torch.randn(1, 2, n, 4, generator=generator)


def test_updates_match_concatenation_across_growth():
    growing, plain = GrowingLayer(), DynamicLayer()
    sizes = [MIN_CAPACITY - 3, 1, 5, 300, 2]  # the third and fourth updates outgrow the buffer
    for seed, n in enumerate(sizes):
        keys, values = _rows(n, seed)
        got = growing.update(keys, values)
        want = plain.update(keys, values)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    assert growing.get_seq_length() == sum(sizes)


def test_shortened_views_are_overwritten_by_the_next_update():
    layer = GrowingLayer()
    keys, values = _rows(10, 0)
    layer.update(keys, values)
    layer.keys, layer.values = layer.keys[..., :6, :], layer.values[..., :6, :]  # what transformers' crop does
    more_keys, more_values = _rows(3, 1)
    got_keys, got_values = layer.update(more_keys, more_values)
    torch.testing.assert_close(got_keys, torch.cat([keys[..., :6, :], more_keys], dim=-2), rtol=0, atol=0)
    torch.testing.assert_close(got_values, torch.cat([values[..., :6, :], more_values], dim=-2), rtol=0, atol=0)


def test_a_pool_cut_shortens_every_layer_by_its_length_alone_and_foreign_tensors_are_refused():
    layers = [GrowingLayer(), GrowingLayer()]
    for seed, layer in enumerate(layers):
        layer.update(*_rows(10, seed))
    pool = KVPool(layers)
    before = [layer.keys.clone() for layer in layers]
    pool.cut(4)
    for layer, keys in zip(layers, before):
        assert layer.get_seq_length() == 4 and layer.keys.data_ptr() == pool.keys[layers.index(layer)].data_ptr()
        torch.testing.assert_close(layer.keys, keys[..., :4, :], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="prefixes of its buffer"):
        layers[0].keys = torch.zeros(1, 2, 4, 4)  # a copy would silently leave the pool


def test_growing_cache_creates_growing_layers():
    model = make_tiny_llama()
    tree_model = TreeModel(model)
    tree_model.prefill(random_prompt(0))
    assert tree_model.cache.layers and all(isinstance(layer, GrowingLayer) for layer in tree_model.cache.layers)
    pools = pooled(tree_model.cache)  # the prefill pooled them: one tensor for every layer
    assert len(pools) == 1 and pools[0].layers == tree_model.cache.layers
    assert isinstance(growing_cache().layer_class_to_replicate(), GrowingLayer)


def test_tree_steps_match_a_fresh_forward_over_the_kept_sequence():
    """After prefill, a branching tree and a compaction, the next logits equal a no-cache forward."""
    model = make_tiny_llama(seed=2)
    prompt = random_prompt(4)
    tree_model = TreeModel(model)
    tree_model.prefill(prompt)
    tree = DraftTree(
        tokens=np.array([7, 8, 9, 10, 11]),
        parents=np.array([-1, 0, 0, 2, 3]),
        depths=np.array([0, 1, 1, 2, 3]),
        probs=np.ones(5),
    )
    tree_model.score_trees([tree])
    tree_model.keep([np.array([0, 2, 3])])  # root, then the second branch: tokens 7, 9, 10
    step = DraftTree(tokens=np.array([12]), parents=np.array([-1]), depths=np.array([0]), probs=np.ones(1))
    got = tree_model.score_trees([step])[0, 0]
    full = torch.cat([prompt, torch.tensor([[7, 9, 10, 12]])], dim=1)
    with torch.no_grad():
        want = model(full).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_dense_cache_leaves_row_visibility_alone_until_rows_accept_unlike():
    """One row (or rows accepting alike) stays dense: ``visible`` / ``slot_pos`` are not
    extended per step. When two rows keep different counts the rows are written out: the
    shorter row's gap is hidden, and its next logits still equal a no-cache forward."""
    model = make_tiny_llama(seed=2)
    prompts = torch.cat([random_prompt(4), random_prompt(5)])
    tree_model = TreeModel(model)
    tree_model.prefill(prompts)
    chain = DraftTree(tokens=np.array([7, 8, 9]), parents=np.array([-1, 0, 1]), depths=np.arange(3), probs=np.ones(3))
    tree_model.score_trees([chain, chain])
    tree_model.keep([np.array([0, 1]), np.array([0, 1])])
    slots = tree_model.slots
    assert slots.dense and slots.visible.shape == (2, prompts.shape[1])  # untouched since prefill
    tree_model.score_trees([chain, chain])
    tree_model.keep([np.array([0, 1, 2]), np.array([0])])
    assert not slots.dense
    length = prompts.shape[1] + 2
    assert tree_model.length == length + 3
    assert slots.visible[0].all() and slots.visible[1, : length + 1].all() and not slots.visible[1, length + 1 :].any()
    assert slots.slot_pos[1, length] == length
    step = DraftTree(tokens=np.array([12]), parents=np.array([-1]), depths=np.array([0]), probs=np.ones(1))
    got = tree_model.score_trees([step, step])[:, 0]
    with torch.no_grad():
        want = [model(torch.cat([prompts[i : i + 1], torch.tensor([extra])], dim=1)).logits[0, -1]
                for i, extra in enumerate(([7, 8, 7, 8, 9, 12], [7, 8, 7, 12]))]
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-4, atol=1e-4)


def _pool(keys: torch.Tensor, layers: int = 2) -> tuple[list[GrowingLayer], KVPool]:
    """``layers`` layers holding ``keys + 10 * i`` (layer i's values: its keys + 1), pooled."""
    grown = [GrowingLayer() for _ in range(layers)]
    for i, layer in enumerate(grown):
        layer.update(keys + 10 * i, keys + 10 * i + 1)
    cache = growing_cache()
    cache.layers = grown
    pools = pooled(cache)
    assert len(pools) == 1 and pooled(cache) == pools  # one pool, made once
    return grown, pools[0]


def test_move_copies_positions_within_each_batch_row_every_head_and_every_layer():
    keys = torch.randn(3, 2, 10, 4)
    layers, pool = _pool(keys)
    pool.move(np.array([0, 2, 2]), np.array([9, 7, 8]), np.array([5, 3, 4]))
    expected = keys.clone()
    expected[0, :, 5], expected[2, :, 3], expected[2, :, 4] = keys[0, :, 9], keys[2, :, 7], keys[2, :, 8]
    for i, layer in enumerate(layers):
        assert torch.equal(layer.keys, expected + 10 * i)
        assert torch.equal(layer.values, expected + 10 * i + 1)


def test_a_retired_row_is_replaced_by_the_last_row_in_every_layer():
    keys = torch.randn(4, 2, 6, 4)
    layers, pool = _pool(keys)
    pool.retire_row(1, live=6)
    for i, layer in enumerate(layers):
        assert layer.keys.shape == (3, 2, 6, 4)
        assert torch.equal(layer.keys, keys[[0, 3, 2]] + 10 * i)
        assert torch.equal(layer.values, keys[[0, 3, 2]] + 10 * i + 1)
        layer.update(torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 4))  # the batch goes on with three rows
        assert layer.keys.shape == (3, 2, 7, 4)


def test_pooled_layers_grow_together_and_keep_every_row():
    keys = torch.randn(1, 2, 10, 4)
    layers, pool = _pool(keys)
    plain = [DynamicLayer() for _ in layers]
    for i, layer in enumerate(plain):
        layer.update(keys + 10 * i, keys + 10 * i + 1)
    for seed, n in enumerate([3, MIN_CAPACITY, 2]):  # the second update outgrows the pool
        for layer, reference in zip(layers, plain):  # layer by layer, as a forward updates them
            new_keys, new_values = _rows(n, seed)
            got, want = layer.update(new_keys, new_values), reference.update(new_keys, new_values)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert pool.capacity >= 10 + 3 + MIN_CAPACITY + 2
    pool.cut(12)
    for layer, reference in zip(layers, plain):
        assert torch.equal(layer.keys, reference.keys[..., :12, :])
        assert torch.equal(layer.values, reference.values[..., :12, :])


def test_a_pool_holds_values_narrower_than_keys():
    """Some models' values have fewer dimensions than their keys (AXK1): both move alike."""
    keys, values = torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 4)
    layers = [GrowingLayer() for _ in range(3)]
    for i, layer in enumerate(layers):
        layer.update(keys + i, values + i)
    cache = growing_cache()
    cache.layers = layers
    (pool,) = pooled(cache)
    pool.move(np.array([0]), np.array([9]), np.array([2]))
    for i, layer in enumerate(layers):
        want_keys, want_values = keys.clone() + i, values.clone() + i
        want_keys[0, :, 2], want_values[0, :, 2] = keys[0, :, 9] + i, values[0, :, 9] + i
        assert torch.equal(layer.keys, want_keys) and torch.equal(layer.values, want_values)
