"""Grouped-query SDPA for tree forwards: same attention, no copied KV cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from retrieval_draft.model.tree_attention import (
    GROUPED_SDPA, grouped_sdpa, sdpa_configs, steady_attention, tree_attention,
)

from tests.conftest import make_tiny_llama


class _Layer(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _tree_mask(n: int, past: int, seed: int) -> torch.Tensor:
    """(1, 1, n, past + n) additive mask: the cache visible, each node sees itself and a random earlier node."""
    rng = np.random.default_rng(seed)
    allowed = np.zeros((n, past + n), dtype=bool)
    allowed[:, :past] = True
    for i in range(n):
        allowed[i, past + i] = True
        if i:
            allowed[i, past + rng.integers(0, i)] = True
    mask = torch.zeros(allowed.shape)
    mask.masked_fill_(torch.from_numpy(~allowed), torch.finfo(torch.float32).min)
    return mask[None, None]


@pytest.mark.parametrize("groups,n", [(3, 1), (3, 7), (2, 16), (1, 5)])
def test_grouped_sdpa_matches_hf_sdpa(groups, n):
    torch.manual_seed(groups * 10 + n)
    kv_heads, past, dim = 2, 11, 8
    query = torch.randn(1, kv_heads * groups, n, dim)
    key = torch.randn(1, kv_heads, past + n, dim)
    value = torch.randn(1, kv_heads, past + n, dim)
    mask = _tree_mask(n, past, seed=n)
    layer = _Layer(groups)
    got, _ = grouped_sdpa(layer, query, key, value, mask, scaling=dim**-0.5)
    want, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=dim**-0.5)
    assert got.shape == (1, n, kv_heads * groups, dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("groups,n", [(3, 1), (2, 6)])
def test_grouped_sdpa_matches_hf_sdpa_for_a_batch_with_one_mask_per_row(groups, n):
    torch.manual_seed(groups + n)
    rows, kv_heads, past, dim = 3, 2, 9, 8
    query = torch.randn(rows, kv_heads * groups, n, dim)
    key = torch.randn(rows, kv_heads, past + n, dim)
    value = torch.randn(rows, kv_heads, past + n, dim)
    mask = torch.cat([_tree_mask(n, past, seed=row) for row in range(rows)])  # (rows, 1, n, past + n)
    mask[1, ..., :3] = torch.finfo(torch.float32).min  # row 1: three padded cache slots
    layer = _Layer(groups)
    got, _ = grouped_sdpa(layer, query, key, value, mask, scaling=dim**-0.5)
    want, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=dim**-0.5)
    assert got.shape == (rows, n, kv_heads * groups, dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_switch_is_scoped_to_the_block():
    model = make_tiny_llama(attn="sdpa")
    configs = sdpa_configs(model)
    assert configs and all(c._attn_implementation == "sdpa" for c in configs)
    with tree_attention(configs):
        assert model.config._attn_implementation == GROUPED_SDPA
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError), tree_attention(configs):
        raise ValueError("inside")
    assert model.config._attn_implementation == "sdpa"


def test_eager_models_are_left_alone():
    model = make_tiny_llama(attn="eager")
    assert sdpa_configs(model) == []


def test_a_forward_tiles_its_mask_once_for_every_layer_and_only_inside_the_block(monkeypatch):
    from retrieval_draft.model import tree_attention as module
    from retrieval_draft.model.tree_model import TreeModel
    from retrieval_draft.tree import DraftTree

    mask = _tree_mask(3, 5, seed=0)
    outside = [module.tiled(mask, 2), module.tiled(mask, 2)]
    assert outside[0] is not outside[1] and torch.equal(outside[0], outside[1])
    with tree_attention([]):
        inside = [module.tiled(mask, 2), module.tiled(mask, 2), module.tiled(mask, 3)]
        assert inside[0] is inside[1] and inside[2] is not inside[0]
    assert torch.equal(inside[0], outside[0]) and inside[0].shape == (1, 1, 6, 8)
    assert torch.equal(inside[0][0, 0, 3:], mask[0, 0]) and torch.equal(inside[2][0, 0, 6:], mask[0, 0])

    returned = []  # one real tree forward of a 2-layer model: both layers get the one tiled mask
    original = module.tiled
    monkeypatch.setattr(module, "tiled", lambda m, g: returned.append(original(m, g)) or returned[-1])
    tree_model = TreeModel(make_tiny_llama())
    tree_model.prefill(torch.randint(3, 300, (1, 6)))
    tree = DraftTree(tokens=np.array([5, 6, 7]), parents=np.array([-1, 0, 0]), depths=np.array([0, 1, 1]),
                     probs=np.ones(3))
    tree_model.score_trees([tree])
    assert len(returned) == tree_model.model.config.num_hidden_layers == 2 and returned[0] is returned[1]


@pytest.fixture
def sdpa_flags():
    """SDPA's four process-wide backend switches, restored after the test."""
    cuda = torch.backends.cuda
    names = ("cudnn", "flash", "mem_efficient", "math")
    before = {name: getattr(cuda, f"{name}_sdp_enabled")() for name in names}
    yield {name: getattr(cuda, f"enable_{name}_sdp") for name in names}
    for name, enabled in before.items():
        getattr(cuda, f"enable_{name}_sdp")(enabled)


def _enabled() -> dict:
    cuda = torch.backends.cuda
    return {name: getattr(cuda, f"{name}_sdp_enabled")() for name in ("cudnn", "flash", "mem_efficient", "math")}


def test_a_masked_forward_on_cuda_keeps_off_cudnn_attention_and_restores_it(sdpa_flags):
    for enable in sdpa_flags.values():
        enable(True)
    with steady_attention(torch.device("cuda")):
        assert _enabled() == {"cudnn": False, "flash": True, "mem_efficient": True, "math": True}
    assert _enabled() == {"cudnn": True, "flash": True, "mem_efficient": True, "math": True}
    with pytest.raises(ValueError), steady_attention(torch.device("cuda:0")):
        assert not _enabled()["cudnn"]
        raise ValueError("inside")
    assert _enabled()["cudnn"]


def test_steady_attention_changes_nothing_off_cuda_or_where_no_other_kernel_takes_a_mask(sdpa_flags):
    for enable in sdpa_flags.values():
        enable(True)
    with steady_attention(torch.device("cpu")):
        assert _enabled()["cudnn"]
    sdpa_flags["mem_efficient"](False)
    sdpa_flags["math"](False)  # only cuDNN (and flash, which takes no mask) left: the user's choice stands
    with steady_attention(torch.device("cuda")):
        assert _enabled() == {"cudnn": True, "flash": True, "mem_efficient": False, "math": False}
    sdpa_flags["math"](True)
    sdpa_flags["cudnn"](False)  # off already: stays off afterwards
    with steady_attention(torch.device("cuda")):
        assert not _enabled()["cudnn"]
    assert not _enabled()["cudnn"]


def test_tree_forwards_with_a_mask_and_only_those_run_inside_steady_attention(monkeypatch):
    from contextlib import nullcontext

    from retrieval_draft.model import tree_model as module
    from retrieval_draft.tree import DraftTree

    asked = []
    monkeypatch.setattr(module, "steady_attention", lambda device: asked.append(device) or nullcontext())
    tree_model = module.TreeModel(make_tiny_llama())
    tree_model.prefill(torch.randint(3, 300, (1, 6)))
    assert asked == []  # an unpadded prefill: the model's own causal mask
    lone = DraftTree(tokens=np.array([5]), parents=np.array([-1]), depths=np.array([0]), probs=np.ones(1))
    tree_model.score_trees([lone])
    tree_model.keep([np.zeros(1, dtype=np.int64)])
    assert asked == []  # a lone root: the model's own causal mask, as plain decoding
    tree = DraftTree(tokens=np.array([5, 6, 7]), parents=np.array([-1, 0, 0]), depths=np.array([0, 1, 1]),
                     probs=np.ones(3))
    tree_model.score_trees([tree])
    assert asked == [tree_model.device]
