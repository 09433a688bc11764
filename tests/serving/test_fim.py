"""Fill-in-the-middle prompts read from a tokenizer (``serving.fim``) and llama.cpp's ``/infill`` body
checked and turned into HF's completion request (``serving.infill``), without a server."""

from __future__ import annotations

import json

import pytest
from transformers import GenerationConfig

from retrieval_draft.errors import InvalidInputError, NoFillInMiddleError
from retrieval_draft.serving.fim import (
    SNIPPET_SEPARATOR,
    ExtraChunk,
    FimTemplate,
    end_token_ids,
    fim_prompt,
    fim_template,
)
from retrieval_draft.serving.infill import DEFAULT_N_PREDICT, InfillRequest, completion_body, parse_infill
from tests.datastore_fixtures import bpe_tokenizer
from tests.doc_preamble import FIM_TOKENS

TEXTS = ["def add(a, b):\n    return a + b\n", "import os\nprint(os.getcwd())\n"] * 20


@pytest.fixture(scope="module")
def plain_tokenizer():
    return bpe_tokenizer(TEXTS, vocab_size=300)


@pytest.fixture(scope="module")
def coder_tokenizer():
    tokenizer = bpe_tokenizer(TEXTS, vocab_size=300)
    tokenizer.add_tokens(list(FIM_TOKENS), special_tokens=True)
    return tokenizer


def test_a_tokenizer_with_qwens_fim_tokens_gets_qwens_template(coder_tokenizer):
    template = fim_template(coder_tokenizer)
    assert (template.prefix, template.suffix, template.middle) == ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
    assert (template.repo_name, template.file_sep) == ("<|repo_name|>", "<|file_sep|>")
    # only the closing tokens this tokenizer has (no <|im_end|> here)
    assert template.ends == ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>")
    assert end_token_ids(coder_tokenizer, template) == coder_tokenizer.convert_tokens_to_ids(list(template.ends))


def test_a_starcoder_style_tokenizer_gets_its_own_template_without_repository_tokens():
    tokenizer = bpe_tokenizer(TEXTS, vocab_size=300)
    tokenizer.add_tokens(["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"], special_tokens=True)
    template = fim_template(tokenizer)
    assert (template.prefix, template.suffix, template.middle) == ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    assert template.repo_name is None and template.file_sep is None and template.ends == ("<fim_pad>",)


def test_a_model_without_fim_tokens_is_refused_in_one_line_naming_it(plain_tokenizer):
    with pytest.raises(NoFillInMiddleError) as caught:
        fim_template(plain_tokenizer, "smollm2-135m")
    assert str(caught.value).startswith("smollm2-135m has no fill-in-the-middle tokens")
    assert "\n" not in str(caught.value)


def test_fim_tokens_written_as_plain_words_are_not_fim_tokens():
    tokenizer = bpe_tokenizer(TEXTS, vocab_size=300)
    tokenizer.add_tokens(["<|fim_prefix|>", "<|fim_suffix|>"], special_tokens=True)  # no middle token
    with pytest.raises(NoFillInMiddleError):
        fim_template(tokenizer)


QWEN = FimTemplate("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>")


def test_the_prompt_frames_prefix_and_typed_text_then_suffix_then_asks_for_the_middle():
    prompt = fim_prompt(QWEN, "def f(x):\n    ", "\n\nprint(f(2))\n", typed="ret")
    assert prompt == "<|fim_prefix|>def f(x):\n    ret<|fim_suffix|>\n\nprint(f(2))\n<|fim_middle|>"


def test_other_files_come_first_in_the_repository_layout_llama_cpp_uses():
    extra = (ExtraChunk("util.py", "def g():\n    pass\n"), ExtraChunk("tmp", "X = 1\n"))
    prompt = fim_prompt(QWEN, "a", "b", extra)
    assert prompt == ("<|repo_name|>myproject\n<|file_sep|>util.py\ndef g():\n    pass\n<|file_sep|>tmp\nX = 1\n"
                      "<|file_sep|>filename\n<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>")


def test_other_files_come_after_a_snippet_line_when_the_model_has_no_file_separator():
    starcoder = FimTemplate("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    prompt = fim_prompt(starcoder, "a", "b", (ExtraChunk("u.py", "one"), ExtraChunk("v.py", "two")))
    assert prompt == f"{SNIPPET_SEPARATOR}one{SNIPPET_SEPARATOR}two<fim_prefix>a<fim_suffix>b<fim_middle>"


def test_an_infill_body_is_read_with_llama_cpps_names_and_defaults():
    body = {"input_prefix": "def f():\n", "input_suffix": "\nf()\n", "prompt": "    re", "n_predict": 32,
            "input_extra": [{"filename": "a.py", "text": "A = 1\n"}, {"text": "B = 2\n"}],
            "top_k": 40, "top_p": 0.9, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            "t_max_predict_ms": 1000, "stop": [], "id_slot": 0, "response_fields": ["content"]}
    request = parse_infill(body)
    assert request == InfillRequest("def f():\n", "\nf()\n", (ExtraChunk("a.py", "A = 1\n"), ExtraChunk("tmp", "B = 2\n")),
                                    "    re", 32, 0.0, 40, 0.9, None, (), False, 0, 1000)
    assert parse_infill({}) == InfillRequest()  # greedy, the server's own length
    assert parse_infill({"n_predict": -1, "seed": -1}).n_predict is None
    assert parse_infill({"t_max_predict_ms": -1, "n_indent": 0}) == InfillRequest()  # llama.cpp's "no limit"
    assert parse_infill({}).editor_stops(None) is None


@pytest.mark.parametrize("body, words", [
    ({"input_prefix": 3}, "input_prefix must be a string"),
    ({"n_predict": "8"}, "n_predict must be an integer"),
    ({"n_predict": True}, "n_predict must be an integer"),
    ({"input_extra": ["text"]}, "input_extra[0] must be an object"),
    ({"input_extra": [{"text": 1}]}, "text must be a string"),
    ({"temperature": -1}, "temperature must be >= 0"),
    ({"top_p": 0}, "top_p in (0, 1]"),
    ({"stop": [1]}, "stop must be a list of strings"),
    ({"stream": "yes"}, "stream must be true or false"),
    ({"n_indent": -1}, "n_indent must be >= 0"),
    ({"n_indent": "4"}, "n_indent must be an integer"),
    ({"t_max_predict_ms": 0.5}, "t_max_predict_ms must be an integer"),
])
def test_a_bad_infill_field_is_refused_in_one_line(body, words):
    with pytest.raises(InvalidInputError) as caught:
        parse_infill(body)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_the_completion_request_asks_greedily_for_the_middle_ending_at_the_fim_end_tokens(coder_tokenizer):
    config = GenerationConfig(eos_token_id=2, pad_token_id=0, top_k=20, temperature=0.7, do_sample=True)
    body = completion_body(parse_infill({"input_prefix": "x = ", "input_suffix": "\n", "n_predict": 0,
                                         "top_k": 40, "stop": "\n\n"}), "coder", coder_tokenizer, config)
    assert body["prompt"] == "<|fim_prefix|>x = <|fim_suffix|>\n<|fim_middle|>"
    assert body["model"] == "coder" and body["max_tokens"] == 0 and body["stop"] == ["\n\n"]
    generation = json.loads(body["generation_config"])
    template = fim_template(coder_tokenizer)
    assert generation["eos_token_id"] == [2, *end_token_ids(coder_tokenizer, template)]
    assert generation["do_sample"] is False and "top_k" not in generation and "temperature" not in generation
    GenerationConfig(**generation).validate(strict=True)  # what HF's server makes of it


def test_the_completion_request_samples_when_asked_and_keeps_the_servers_default_length(coder_tokenizer):
    config = GenerationConfig(eos_token_id=[2, 5], pad_token_id=0)
    body = completion_body(parse_infill({"temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 7}), "coder",
                           coder_tokenizer, config)
    generation = json.loads(body["generation_config"])
    assert (generation["do_sample"], generation["temperature"], generation["top_k"], generation["top_p"]) == (
        True, 0.8, 40, 0.9)
    assert generation["max_new_tokens"] == DEFAULT_N_PREDICT and "max_tokens" not in body and body["seed"] == 7
    assert generation["eos_token_id"][:2] == [2, 5]


def test_a_model_without_fim_tokens_gets_no_completion_request(plain_tokenizer):
    with pytest.raises(NoFillInMiddleError, match="^tiny has no fill-in-the-middle tokens"):
        completion_body(InfillRequest(), "tiny", plain_tokenizer, GenerationConfig(eos_token_id=2))
