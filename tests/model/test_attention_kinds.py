"""Every attention rule transformers builds masks for is honoured: all-layer sliding windows
(Mistral style), chunked attention (Llama 4), position biases verified as chains (Bloom's ALiBi),
and recurrent caches refused before any forward."""

import pytest
import torch
from transformers import (BloomConfig, BloomForCausalLM, Llama4ForCausalLM, Llama4TextConfig, MambaConfig,
                          MambaForCausalLM, MistralConfig, MistralForCausalLM)

import retrieval_draft
from retrieval_draft.errors import UnsupportedModelError
from retrieval_draft.model.attention_layout import CHAIN, CHUNKED, SLIDING, TREE, attention_layout

SPAN = 8
TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _ready(model):
    model.eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def mistral():
    torch.manual_seed(0)
    return _ready(MistralForCausalLM(MistralConfig(**TINY, sliding_window=SPAN, attn_implementation="sdpa")))


@pytest.fixture(scope="module")
def llama4():
    torch.manual_seed(0)
    return _ready(Llama4ForCausalLM(Llama4TextConfig(**TINY, head_dim=16, attention_chunk_size=SPAN,
                                                     attn_implementation="sdpa")))


@pytest.fixture(scope="module")
def bloom():
    torch.manual_seed(0)
    config = BloomConfig(vocab_size=300, hidden_size=64, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    return _ready(BloomForCausalLM(config))


def _prompt(seed: int) -> torch.Tensor:
    """A random 12-token block repeated 4 times: 48 tokens, past the 8-token window or chunk."""
    block = torch.randint(3, 300, (12,), generator=torch.Generator().manual_seed(seed))
    return block.repeat(4).unsqueeze(0)


def _same_as_greedy(model, prompt, **extra):
    expected = model.generate(prompt, max_new_tokens=24, do_sample=False, **extra)
    stats = retrieval_draft.DecodeStats()
    got = model.generate(prompt, max_new_tokens=24, custom_generate=retrieval_draft.generate,
                         adaptive_tree=False, tree_budget=12, draft_stats=stats, **extra)
    return torch.equal(got, expected), stats


def test_the_layouts_follow_transformers_rule(mistral, llama4, bloom):
    assert [(k.key, k.span) for k in attention_layout(mistral).kinds] == [(SLIDING, SPAN)]
    assert attention_layout(mistral).mode == TREE and not attention_layout(mistral).keyed
    assert [(k.key, k.span) for k in attention_layout(llama4).kinds] == [(CHUNKED, SPAN)]
    assert attention_layout(bloom).mode == CHAIN and "position_ids" in attention_layout(bloom).chain_reason


@pytest.mark.parametrize("seed", range(3))
def test_an_all_layer_sliding_window_is_honoured_past_the_window(mistral, seed):
    same, stats = _same_as_greedy(mistral, _prompt(seed))
    assert same and stats.tree_nodes > stats.steps  # real trees were verified


@pytest.mark.parametrize("seed", range(3))
def test_chunked_attention_is_honoured_across_chunk_borders(llama4, seed):
    same, stats = _same_as_greedy(llama4, _prompt(seed))
    assert same and stats.tree_nodes > stats.steps


@pytest.mark.parametrize("seed", range(3))
def test_alibi_models_verify_chains_exactly(bloom, seed):
    same, stats = _same_as_greedy(bloom, _prompt(seed))
    assert same and stats.mean_accepted > 1  # the chains' drafts were accepted


def _padded_pair(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    other = torch.randint(3, 300, (1, 41), generator=torch.Generator().manual_seed(seed + 100))
    ids = torch.cat([_prompt(seed), torch.cat([torch.zeros(1, 7, dtype=torch.long), other], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    return ids, mask


@pytest.mark.parametrize("name", ["mistral", "llama4", "bloom"])
def test_batches_honour_windows_chunks_and_chains(name, request):
    model = request.getfixturevalue(name)
    ids, mask = _padded_pair(0)
    same, _ = _same_as_greedy(model, ids, attention_mask=mask)
    assert same


def test_recurrent_models_are_refused_with_one_typed_line_before_any_forward():
    torch.manual_seed(0)
    model = _ready(MambaForCausalLM(MambaConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                                state_size=4, bos_token_id=1, eos_token_id=2, pad_token_id=0)))
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(UnsupportedModelError, match="recurrent") as refused:
        model.generate(_prompt(0), max_new_tokens=4, custom_generate=retrieval_draft.generate)
    assert "\n" not in str(refused.value) and calls == []


def test_a_tree_over_a_dense_cache_gets_the_mask_the_general_rule_builds():
    from transformers import LlamaConfig, LlamaForCausalLM

    layout = attention_layout(_ready(LlamaForCausalLM(LlamaConfig(**TINY))))
    among = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)  # root, two children
    cached, width = 5, 3
    allowed = torch.cat([torch.ones((1, width, cached), dtype=torch.bool), among], dim=2)
    positions = torch.tensor([[5, 6, 6]])
    key_pos = torch.cat([torch.arange(cached)[None], positions], dim=1)
    general = layout.masks(allowed, positions, key_pos, torch.float32)
    direct = layout.tree_over_dense_cache(among, cached, positions, torch.float32)
    assert direct.shape == (1, 1, width, cached + width) and torch.equal(direct, general)
    assert (direct[0, 0, 1, cached + 2] == torch.finfo(torch.float32).min) and direct[0, 0, 2, cached] == 0
