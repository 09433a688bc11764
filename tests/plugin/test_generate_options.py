"""``generate``'s own options through the plugin: honoured exactly as HF does, or refused by name."""

from __future__ import annotations

import pytest
import torch
from transformers.generation import (
    GenerateDecoderOnlyOutput,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import retrieval_draft
import retrieval_draft.sessions.session
from retrieval_draft.drafters.oracle import OracleDrafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.errors import InvalidInputError
from retrieval_draft_datastore.cli import main as cli_main
from tests.conftest import make_tiny_llama, random_prompt
from tests.decode.test_engine_greedy import MixedDrafter

REAL_VOCAB = 49152  # SmolLM2's tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    from retrieval_draft.model.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def wide_llama():
    """The tiny random Llama with SmolLM2's vocabulary, to pair with its tokenizer."""
    return make_tiny_llama(seed=3, vocab_size=REAL_VOCAB)


def ours(model, prompt, max_new_tokens, drafters, **kwargs):
    """Our plugin on fixed-size trees (per-step behaviour independent of machine timings)."""
    kwargs.setdefault("adaptive_tree", False)
    kwargs.setdefault("tree_budget", 16)
    kwargs.setdefault("draft_learning", False)
    return model.generate(
        prompt, max_new_tokens=max_new_tokens, custom_generate=retrieval_draft.generate, drafters=drafters, **kwargs
    )


def reference(model, prompt, max_new_tokens, **kwargs) -> torch.Tensor:
    """HF greedy output, shape (1, L + n), with no EOS."""
    return model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=[], **kwargs)


def test_stop_strings_stop_where_hf_stops(wide_llama, tokenizer):
    prompt = torch.tensor([tokenizer.encode("def add(a, b):\n    return a + b\n")])
    full = reference(wide_llama, prompt, 40)
    text = tokenizer.decode(full[0, prompt.shape[1] :])
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # a few characters mid-output, likely across tokens
    expected = reference(wide_llama, prompt, 40, stop_strings=[stop], tokenizer=tokenizer)
    assert expected.shape[1] < full.shape[1]  # HF did stop early
    for drafters in ([OracleDrafter(full[0].numpy())], [MixedDrafter(full[0].numpy(), seed=1)], [PromptLookupDrafter()]):
        got = ours(wide_llama, prompt, 40, drafters, eos_token_id=[], stop_strings=[stop], tokenizer=tokenizer)
        assert torch.equal(got, expected)


def test_stop_strings_without_a_tokenizer_fail_as_in_hf(tiny_llama):
    with pytest.raises(ValueError, match="tokenizer"):
        ours(tiny_llama, random_prompt(0), 8, [PromptLookupDrafter()], stop_strings=["x"])


def test_return_dict_in_generate_returns_hfs_output_class(tiny_llama):
    prompt = random_prompt(1, length=12, repeat=2)
    expected = reference(tiny_llama, prompt, 16)
    got = ours(tiny_llama, prompt, 16, [PromptLookupDrafter()], eos_token_id=[], return_dict_in_generate=True)
    assert isinstance(got, GenerateDecoderOnlyOutput)
    assert torch.equal(got.sequences, expected)
    assert got.scores is None and got.logits is None


def _assert_rows_close(ours_rows, hf_rows):
    assert len(ours_rows) == len(hf_rows)
    for mine, theirs in zip(ours_rows, hf_rows):
        assert mine.shape == theirs.shape
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("processing", [{}, {"repetition_penalty": 1.3, "min_new_tokens": 4}])
@pytest.mark.parametrize("drafting", ["oracle", "mixed", "prompt"])
def test_greedy_scores_and_logits_equal_hfs(tiny_llama, processing, drafting):
    prompt = random_prompt(2, length=12, repeat=2)
    asked = dict(return_dict_in_generate=True, output_scores=True, output_logits=True, eos_token_id=[], **processing)
    expected = tiny_llama.generate(prompt, max_new_tokens=20, do_sample=False, **asked)
    full = expected.sequences[0].numpy()
    drafters = {
        "oracle": [OracleDrafter(full)],
        "mixed": [MixedDrafter(full, seed=2)],
        "prompt": [PromptLookupDrafter()],
    }[drafting]
    got = ours(tiny_llama, prompt, 20, drafters, **asked)
    assert torch.equal(got.sequences, expected.sequences)
    _assert_rows_close(got.logits, expected.logits)
    _assert_rows_close(got.scores, expected.scores)


def test_scores_stop_with_the_tokens_at_an_eos_inside_an_accepted_draft(tiny_llama):
    prompt = random_prompt(3, length=12, repeat=2)
    full = reference(tiny_llama, prompt, 24)[0]
    new = full[prompt.shape[1] :].tolist()
    eos = next(token for i, token in enumerate(new) if i >= 8 and token not in new[:i])  # first seen mid-output
    asked = dict(return_dict_in_generate=True, output_scores=True, output_logits=True, eos_token_id=eos)
    expected = tiny_llama.generate(prompt, max_new_tokens=24, do_sample=False, **asked)
    assert expected.sequences.shape[1] < full.shape[0]
    got = ours(tiny_llama, prompt, 24, [OracleDrafter(full.numpy())], **asked)  # drafts run past the EOS
    assert torch.equal(got.sequences, expected.sequences)
    _assert_rows_close(got.logits, expected.logits)
    _assert_rows_close(got.scores, expected.scores)


def test_sampled_scores_are_the_processed_logits_of_each_tokens_prefix(tiny_llama):
    prompt = random_prompt(4, length=12, repeat=3)
    warpers = dict(temperature=0.7, top_k=20, top_p=0.9)
    got = ours(
        tiny_llama, prompt, 16, [PromptLookupDrafter()], do_sample=True, draft_seed=5, eos_token_id=[],
        return_dict_in_generate=True, output_scores=True, output_logits=True, **warpers,
    )
    sequence = got.sequences
    new = sequence.shape[1] - prompt.shape[1]
    assert len(got.scores) == len(got.logits) == new
    with torch.no_grad():
        logits = tiny_llama(sequence).logits[0, prompt.shape[1] - 1 : -1].float()  # (new, V)
    processor = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.9)])
    for j in range(new):
        prefix = sequence[:, : prompt.shape[1] + j]
        torch.testing.assert_close(got.logits[j], logits[j : j + 1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.scores[j], processor(prefix, logits[j : j + 1].clone()), atol=1e-4, rtol=1e-4)
        assert torch.isfinite(got.scores[j][0, sequence[0, prompt.shape[1] + j]])  # the token was allowed


REFUSED = [
    ("output_attentions", dict(output_attentions=True, return_dict_in_generate=True)),
    ("output_hidden_states", dict(output_hidden_states=True, return_dict_in_generate=True)),
    ("num_beams", dict(num_beams=2)),
    ("num_return_sequences", dict(num_return_sequences=2, do_sample=True)),
    ("num_beam_groups", dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0)),
    ("force_words_ids", dict(force_words_ids=[[5]], num_beams=2)),
    ("penalty_alpha", dict(penalty_alpha=0.6, top_k=4)),
    ("dola_layers", dict(dola_layers="high")),
    ("guidance_scale", dict(guidance_scale=1.5)),
    ("prompt_lookup_num_tokens", dict(prompt_lookup_num_tokens=3)),
    ("assistant_early_exit", dict(assistant_early_exit=1)),
]


@pytest.mark.parametrize("option, kwargs", REFUSED, ids=[option for option, _ in REFUSED])
def test_options_that_cannot_be_honoured_are_refused_by_name_before_model_work(tiny_llama, option, kwargs):
    forwards = []
    hook = tiny_llama.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        with pytest.raises(InvalidInputError, match=option):
            ours(tiny_llama, random_prompt(5), 8, [PromptLookupDrafter()], **kwargs)
    finally:
        hook.remove()
    assert not forwards


@pytest.mark.parametrize("option, kwargs", REFUSED, ids=[option for option, _ in REFUSED])
def test_a_refusal_is_one_sentence_that_says_not_supported_once(tiny_llama, option, kwargs):
    with pytest.raises(InvalidInputError) as refused:
        ours(tiny_llama, random_prompt(5), 8, [PromptLookupDrafter()], **kwargs)
    message = str(refused.value)
    assert message.count("not supported") == 1 and "\n" not in message, message


def test_an_assistant_model_is_refused_by_name_before_model_work(tiny_llama):
    assistant = make_tiny_llama(seed=9)
    forwards = []
    hooks = [m.register_forward_pre_hook(lambda module, args: forwards.append(1)) for m in (tiny_llama, assistant)]
    try:
        with pytest.raises(InvalidInputError, match="assistant_model"):
            ours(tiny_llama, random_prompt(6), 8, [PromptLookupDrafter()], assistant_model=assistant)
    finally:
        for hook in hooks:
            hook.remove()
    assert not forwards


BAD_NUMBERS = [
    ("--max-new-tokens", "0"),
    ("--tree-budget", "-1"),
    ("--max-draft-len", "0"),
    ("--temperature", "-1"),
    ("--temperature", "0"),
    ("--top-k", "0"),
    ("--top-p", "0"),
    ("--top-p", "1.5"),
]


@pytest.mark.parametrize("flag, value", BAD_NUMBERS)
def test_cli_rejects_an_out_of_range_number_in_one_line_before_loading_a_model(monkeypatch, capsys, flag, value):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(retrieval_draft.sessions.session, "load_session", no_loading)
    code = cli_main(["generate", "--prompt", "hello", flag, value])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and flag in err
