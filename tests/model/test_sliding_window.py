"""Tree masks hold on sliding-window layers (Gemma 3 mixes sliding and full attention)."""

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

import retrieval_draft

WINDOW = 8


@pytest.fixture(scope="module")
def tiny_gemma3():
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        attn_implementation="sdpa", eos_token_id=2, pad_token_id=0, bos_token_id=1,
    )
    model = Gemma3ForCausalLM(config).eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


@pytest.mark.parametrize("seed", range(4))
def test_output_equals_hf_greedy_past_the_sliding_window(tiny_gemma3, seed):
    generator = torch.Generator().manual_seed(seed)
    block = torch.randint(3, 300, (10,), generator=generator)
    prompt = block.repeat(3).unsqueeze(0)  # 30 tokens, well past the 8-token window
    expected = tiny_gemma3.generate(prompt, max_new_tokens=30, do_sample=False)
    stats = retrieval_draft.DecodeStats()
    got = tiny_gemma3.generate(
        prompt, max_new_tokens=30, custom_generate=retrieval_draft.generate,
        adaptive_tree=False, tree_budget=12, draft_stats=stats,
    )
    assert torch.equal(got, expected)
    assert stats.tree_nodes > stats.steps  # real trees were verified, not single tokens
