"""Prefix reuse across calls: a prompt that begins with an earlier call's prompt and output starts
from that call's KV rows, prefills only the rest, and generates what it would have generated."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import BloomConfig, BloomForCausalLM, DynamicCache, MistralConfig, MistralForCausalLM

import retrieval_draft
from retrieval_draft.config import DEFAULTS
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.sessions.memory import PluginMemory
from tests.conftest import make_tiny_llama, random_prompt
from tests.decode.test_batch_greedy import tiny_gemma3

NEW = 16


LOGITS_ATOL = 1e-4  # float32 rounding moves these logits by ~1e-6; a wrong row, position or mask by far more


def ours(model, prompt, memory, mask=None, logits=None, **kwargs):
    """Our plugin on fixed trees; returns (output (B, L + m), stats). With ``logits`` (HF's
    ``output_logits`` of the same call, a tuple of (B, V)), also checks ours against them."""
    stats = retrieval_draft.DecodeStats()
    kwargs.setdefault("adaptive_tree", False)
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt) if mask is None else mask, max_new_tokens=NEW,
                         custom_generate=retrieval_draft.generate, tree_budget=8, draft_memory=memory,
                         draft_stats=stats, return_dict_in_generate=True, output_logits=True, **kwargs)
    if logits is not None:
        assert len(out.logits) == len(logits)
        for got, expected in zip(out.logits, logits):
            seen = ~torch.isnan(got)  # a row after it stopped
            assert torch.allclose(got[seen], expected[seen], atol=LOGITS_ATOL)
    return out.sequences, stats


def plain(model, prompt, mask=None, **kwargs):
    """HF greedy: the sequences (B, L + m)."""
    return plain_logits(model, prompt, mask, **kwargs)[0]


def plain_logits(model, prompt, mask=None, **kwargs):
    """HF greedy: the sequences (B, L + m) and the logits of each new token (a tuple of (B, V))."""
    mask = torch.ones_like(prompt) if mask is None else mask
    out = model.generate(prompt, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                         return_dict_in_generate=True, output_logits=True, **kwargs)
    return out.sequences, out.logits


def session(model, seeds, memory, **kwargs):
    """A chat-like session: each prompt is the last call's prompt and output plus new tokens;
    each call's logits checked against HF greedy's."""
    prompt, results = random_prompt(seeds[0], 30), []
    for seed in seeds[1:]:
        out, stats = ours(model, prompt, memory, logits=plain_logits(model, prompt)[1], **kwargs)
        results.append((prompt, out, stats))
        prompt = torch.cat([out, random_prompt(seed, 7)], dim=1)
    return results


def test_reuse_is_on_by_default_and_the_next_turn_starts_from_the_last_ones_rows():
    assert DEFAULTS.prefix_cache_bytes > 0
    model = make_tiny_llama(seed=81)
    results = session(model, [1, 2, 3, 4], PluginMemory(persist=False), adaptive_tree=True)
    first, *later = results
    assert first[2].reused_tokens == 0 and first[2].prefilled_tokens == first[0].shape[1]
    for prompt, out, stats in later:
        assert stats.reused_tokens > 0 and stats.reuse_note is None
        assert stats.reused_tokens + stats.prefilled_tokens == prompt.shape[1]
        assert stats.prefilled_tokens <= 7 + 1  # the new tokens and the last output token, whose row was never computed
        assert stats.prefix_cache_bytes > 0
        assert torch.equal(out, plain(model, prompt))


def test_outputs_with_reuse_equal_outputs_with_reuse_off():
    model = make_tiny_llama(seed=82)
    reused = session(model, [11, 12, 13, 14, 15], PluginMemory(persist=False))
    for prompt, out, stats in reused:
        strict, strict_stats = ours(model, prompt, PluginMemory(persist=False), prefix_cache_bytes=0)
        assert strict_stats.reused_tokens == 0 and "off" in strict_stats.reuse_note
        assert torch.equal(out, strict)
    assert sum(stats.reused_tokens for _, _, stats in reused) > 0


def test_a_prompt_that_parts_from_the_cached_one_reuses_up_to_where_they_part():
    model = make_tiny_llama(seed=83)
    memory = PluginMemory(persist=False)
    prompt = random_prompt(21, 40)
    ours(model, prompt, memory)
    edited = prompt.clone()
    edited[0, 25] = (edited[0, 25] + 1) % 300 + 3  # an edit after 25 tokens
    out, stats = ours(model, edited, memory, logits=plain_logits(model, edited)[1])
    assert stats.reused_tokens == 25 and stats.prefilled_tokens == 15
    assert torch.equal(out, plain(model, edited))
    again, stats = ours(model, prompt, memory)  # the first prompt is still cached beside the edited one
    assert stats.reused_tokens == 39 and torch.equal(again, plain(model, prompt))


def test_each_row_of_a_batch_starts_from_its_own_prefix():
    model = make_tiny_llama(seed=84)
    memory = PluginMemory(persist=False)
    base = [random_prompt(31, 20), random_prompt(32, 30)]
    outs = [ours(model, p, memory)[0] for p in base]
    prompts = [torch.cat([outs[0], random_prompt(33, 5)], 1)[0], torch.cat([outs[1], random_prompt(34, 12)], 1)[0],
               random_prompt(35, 18)[0]]  # the last row has nothing cached
    width = max(p.shape[0] for p in prompts)
    batch = torch.stack([torch.cat([torch.zeros(width - p.shape[0], dtype=torch.long), p]) for p in prompts])
    mask = torch.stack([torch.cat([torch.zeros(width - p.shape[0], dtype=torch.long), torch.ones_like(p)]) for p in prompts])
    expected, logits = plain_logits(model, batch, mask=mask)
    got, stats = ours(model, batch, memory, mask=mask, logits=logits)
    assert stats.reused_tokens == outs[0].shape[1] - 1 + outs[1].shape[1] - 1
    assert torch.equal(got, expected)
    strict, _ = ours(model, batch, PluginMemory(persist=False), mask=mask, prefix_cache_bytes=0)
    assert torch.equal(got, strict)
    for row, prompt in enumerate(prompts):  # every row's sequence was kept, rows that stopped early included
        _, again = ours(model, prompt[None], memory)
        assert again.reused_tokens == prompt.shape[0] - 1


@pytest.mark.parametrize("make", [
    tiny_gemma3,
    lambda: MistralForCausalLM(MistralConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                                             attn_implementation="sdpa", eos_token_id=2, pad_token_id=0)),
], ids=["gemma3-per-layer-window", "mistral-all-layer-window"])
def test_sliding_window_models_reuse_rows_past_the_window_exactly(make):
    torch.manual_seed(0)
    model = make().eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 2, 0
    memory = PluginMemory(persist=False)
    for prompt, out, stats in session(model, [41, 42, 43], memory)[1:]:
        assert stats.reused_tokens > 8  # past the window
        assert torch.equal(out, plain(model, prompt))
    short = [random_prompt(44, 20)[0], random_prompt(45, 9)[0]]
    ours(model, short[0][None], memory)
    batch = torch.stack([short[0], torch.cat([torch.zeros(11, dtype=torch.long), short[1]])])
    mask = (torch.arange(20) >= torch.tensor([[0], [11]])).long()
    expected, logits = plain_logits(model, batch, mask=mask)
    got, stats = ours(model, batch, memory, mask=mask, logits=logits)
    assert stats.reused_tokens == 19
    assert torch.equal(got, expected)


def test_a_model_verified_as_chains_reuses_one_row_and_says_why_a_batch_does_not():
    torch.manual_seed(0)
    model = BloomForCausalLM(BloomConfig(vocab_size=320, hidden_size=64, n_layer=2, n_head=4, bos_token_id=1,
                                         eos_token_id=2, pad_token_id=0)).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 2, 0
    memory = PluginMemory(persist=False)
    for prompt, out, stats in session(model, [51, 52, 53], memory)[1:]:
        assert stats.reused_tokens > 0
        assert torch.equal(out, plain(model, prompt))
    batch = torch.cat([random_prompt(54, 20), random_prompt(55, 20)])
    _, stats = ours(model, batch, memory)
    assert stats.reused_tokens == 0 and "verifies chains" in stats.reuse_note


def test_changed_weights_empty_the_cache():
    model = make_tiny_llama(seed=85)
    memory = PluginMemory(persist=False)
    prompt = random_prompt(61, 30)
    ours(model, prompt, memory)
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
    out, stats = ours(model, prompt, memory)
    assert stats.reused_tokens == 0
    assert torch.equal(out, plain(model, prompt))


def test_a_cache_the_caller_prefilled_is_used_and_extended_as_hf_extends_it():
    model = make_tiny_llama(seed=86)
    prompt = random_prompt(71, 40)
    prefix = DynamicCache()
    with torch.no_grad():
        model(prompt[:, :25], past_key_values=prefix, use_cache=True)
    theirs = copy.deepcopy(prefix)
    expected, logits = plain_logits(model, prompt, past_key_values=theirs)
    mine = copy.deepcopy(prefix)
    got, stats = ours(model, prompt, PluginMemory(persist=False), logits=logits, past_key_values=mine,
                      prefix_cache_bytes=0)
    assert stats.reused_tokens == 25 and stats.prefilled_tokens == 15
    assert torch.equal(got, expected)
    assert mine.get_seq_length() == theirs.get_seq_length() == got.shape[1] - 1
    for ours_layer, hf_layer in zip(mine.layers, theirs.layers):
        assert torch.allclose(ours_layer.keys, hf_layer.keys, atol=1e-5)
    turn = torch.cat([got, random_prompt(72, 6)], dim=1)  # HF's multi-turn idiom: the same cache, next turn
    again, stats = ours(model, turn, PluginMemory(persist=False), past_key_values=mine, prefix_cache_bytes=0)
    assert stats.reused_tokens == got.shape[1] - 1
    assert torch.equal(again, plain(model, turn))


def test_a_cache_the_plugin_cannot_read_is_refused_before_any_forward():
    model = make_tiny_llama(seed=87)
    prompt = random_prompt(73, 20)
    longer = DynamicCache()
    with torch.no_grad():
        model(random_prompt(74, 30), past_key_values=longer, use_cache=True)
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    with pytest.raises(InvalidInputError, match="holds 30 tokens"):
        ours(model, prompt, PluginMemory(persist=False), past_key_values=longer)
    assert forwards == []


@pytest.mark.parametrize("value", [-1, 2.5, "512MB", True])
def test_a_nonsense_cap_is_refused_by_name(value):
    model = make_tiny_llama(seed=88)
    with pytest.raises(InvalidInputError, match="prefix_cache_bytes"):
        ours(model, random_prompt(75, 10), PluginMemory(persist=False), prefix_cache_bytes=value)


def test_real_calls_never_hold_more_than_the_cap():
    model = make_tiny_llama(seed=89)
    memory = PluginMemory(persist=False)
    cap = 40 * 512  # 40 tokens of this model's rows (2 layers x 2 heads x 16 x 4 bytes x keys and values)
    prompt = random_prompt(76, 20)
    for turn in range(12):
        out, stats = ours(model, prompt, memory, prefix_cache_bytes=cap)
        assert 0 < stats.prefix_cache_bytes <= cap
        assert torch.equal(out, plain(model, prompt))
        prompt = torch.cat([out, random_prompt(100 + turn, 5)], 1) if turn % 3 else random_prompt(200 + turn, 25)


def test_threads_sharing_one_model_and_its_cache_all_get_plain_outputs():
    model = make_tiny_llama(seed=90)
    memory = PluginMemory(persist=False)
    base = random_prompt(91, 24)
    prompts = [torch.cat([base, random_prompt(92 + i, 4)], 1) for i in range(6)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        got = list(pool.map(lambda p: ours(model, p, memory), prompts))
    assert all(torch.equal(out, plain(model, p)) for (out, _), p in zip(got, prompts))
    assert sum(stats.reused_tokens for _, stats in got) >= 5 * 24  # every call after the first found the base


def test_in_bfloat16_reused_rows_part_from_plain_generate_only_at_near_ties():
    from tools.bench.exactness import first_divergence

    model = make_tiny_llama(seed=92).to(torch.bfloat16)
    memory = PluginMemory(persist=False)
    prompt = random_prompt(93, 30)
    for turn in range(4):
        out, stats = ours(model, prompt, memory)
        expected, logits = plain_logits(model, prompt)
        split = first_divergence(expected[0, prompt.shape[1]:], out[0, prompt.shape[1]:], torch.stack(logits)[:, 0],
                                 torch.bfloat16)
        assert split is None or split.near_tie, split
        assert turn == 0 or stats.reused_tokens > 0
        prompt = torch.cat([out, random_prompt(94 + turn, 7)], dim=1)


@pytest.mark.parametrize("make", [lambda: make_tiny_llama(seed=95), tiny_gemma3], ids=["llama", "gemma3-windows"])
def test_new_tokens_prefilled_in_chunks_give_plain_generates_output(make, monkeypatch):
    import retrieval_draft.model.tree_model as tree_model

    monkeypatch.setattr(tree_model, "PREFILL_CHUNK", 3)  # every prefill after a reused prefix runs in chunks
    model = make().eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 2, 0
    memory = PluginMemory(persist=False)
    for prompt, out, stats in session(model, [96, 97, 98], memory)[1:]:
        assert stats.reused_tokens > 0 and stats.prefilled_tokens > 3
    first = random_prompt(99, 20)[0]
    ours(model, first[None], memory)
    batch = torch.stack([torch.cat([first, random_prompt(100, 8)[0]]), random_prompt(101, 28)[0]])
    expected, logits = plain_logits(model, batch)
    got, stats = ours(model, batch, memory, logits=logits)  # rows reusing 20 and 0 tokens: gaps in every chunk
    assert stats.reused_tokens == 20 and torch.equal(got, expected)
