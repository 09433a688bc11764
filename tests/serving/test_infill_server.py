"""llama.cpp's ``/infill`` on ``retrieval-draft serve`` over HTTP, asked as llama.vim asks it, and raw
fill-in-the-middle prompts through ``/v1/completions`` with the ``openai`` client.

Two servers run for the module over a tiny code model (random weights, the doc tests' 400-id
tokenizer plus Qwen2.5-Coder's FIM tokens): ours and ``--plain``. The reference for every middle is
plain greedy ``generate`` in this process on the same FIM prompt, ending where the route says a middle
ends (the model's eos or a FIM closing token).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from retrieval_draft.serving.editor_stops import short_line_at
from retrieval_draft.serving.fim import ExtraChunk, end_token_ids, fim_prompt, fim_template
from tests.doc_preamble import FIM_TOKENS, tiny_model_folder
from tools.bench.http_servers import openai_client, served

MODEL = "tiny-coder"
BEFORE = "def fibonacci(n):\n    if n < 2:\n        return n\n"
AFTER = "\n\nprint(fibonacci(10))\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("coder"), MODEL, FIM_TOKENS)


@pytest.fixture(scope="module")
def servers(folder, tmp_path_factory):
    """{"ours": server, "plain": server}, both over the tiny code model."""
    with served(["--model", str(folder)], ["--plain", "--model", str(folder)],
                logs=tmp_path_factory.mktemp("logs")) as (ours, plain):
        yield {"ours": ours, "plain": plain}


@pytest.fixture(scope="module")
def reference(folder):
    """``middle(prompt, n, ends=True)``: plain greedy ``generate``'s text for ``prompt`` (``n`` new tokens
    at most), ending at the model's eos and, with ``ends``, at the FIM closing tokens too; how many
    tokens it made is kept in ``middle.counts[prompt, n, ends]``."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    closing = end_token_ids(tokenizer, fim_template(tokenizer))

    def middle(prompt: str, n: int, ends: bool = True) -> str:
        ids = tokenizer(prompt, return_tensors="pt")
        eos = [model.generation_config.eos_token_id, *(closing if ends else [])]
        out = model.generate(**ids, max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)
        new = out[0, ids["input_ids"].shape[1]:]
        middle.counts[prompt, n, ends] = len(new)
        return tokenizer.decode(new, skip_special_tokens=True)

    middle.counts = {}
    return middle


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its status and body text."""

    status_code: int
    text: str

    def json(self):
        return json.loads(self.text)


def post(server, body: dict):
    """An open answer to ``body`` POSTed as JSON to the server's ``/infill`` (errors included)."""
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/infill", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request, timeout=600)
    except urllib.error.HTTPError as error:
        return error


def infill(server, **body) -> Answer:
    """The server's answer to ``/infill`` with ``body``."""
    with post(server, body) as answer:
        return Answer(answer.status, answer.read().decode("utf-8"))


def streamed(server, **body) -> list[dict]:
    """The events of a streamed ``/infill`` answer."""
    with post(server, {**body, "stream": True}) as answer:
        assert answer.status == 200
        lines = answer.read().decode("utf-8").splitlines()
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]


QWEN_PROMPT = f"<|fim_prefix|>{BEFORE}<|fim_suffix|>{AFTER}<|fim_middle|>"


@pytest.mark.parametrize("name", ["ours", "plain"])
def test_infill_answers_plain_greedy_generate_on_the_fim_prompt(servers, reference, name):
    answer = infill(servers[name], input_prefix=BEFORE, input_suffix=AFTER, n_predict=24)
    assert answer.status_code == 200
    body = answer.json()
    assert body["content"] == reference(QWEN_PROMPT, 24)
    assert body["stop"] is True and body["model"] == MODEL and body["truncated"] is False
    assert body["tokens_predicted"] == reference.counts[QWEN_PROMPT, 24, True] < 24 and body["stop_type"] == "eos"
    # this middle ends at a FIM closing token, where the model's eos alone would let it write on
    assert len(reference(QWEN_PROMPT, 24, ends=False)) > len(body["content"])
    assert '"content":"' in answer.text  # llama.vim's check on the raw answer: compact JSON


def test_infill_as_llama_vim_sends_it_reads_other_files_and_the_typed_text(servers, reference):
    extra = [{"filename": "util.py", "text": "def square(x):\n    return x * x\n"}, {"text": "LIMIT = 10\n"}]
    request = dict(input_prefix=BEFORE, input_suffix=AFTER, input_extra=extra, prompt="    return fib", n_predict=16,
                   top_k=40, top_p=0.9, samplers=["top_k", "top_p", "infill"], stream=False, cache_prompt=True,
                   t_max_prompt_ms=500, t_max_predict_ms=1000, stop=[], n_indent=4, id_slot=0,
                   response_fields=["content", "timings/prompt_n", "truncated"])
    prompt = fim_prompt(fim_template(AutoTokenizer.from_pretrained(servers_folder(servers))), BEFORE, AFTER,
                        (ExtraChunk("util.py", extra[0]["text"]), ExtraChunk("tmp", "LIMIT = 10\n")), "    return fib")
    assert prompt.startswith("<|repo_name|>myproject\n<|file_sep|>util.py\n")
    ours = infill(servers["ours"], **request).json()
    assert ours["content"] == reference(prompt, 16) == infill(servers["plain"], **request).json()["content"]


def servers_folder(servers) -> str:
    """The model folder the servers were started on (from the ours server's command line)."""
    args = servers["ours"].process.args
    return args[args.index("--model") + 1]


def test_a_streamed_infill_is_the_answer_in_pieces_then_a_closing_event(servers):
    whole = infill(servers["ours"], input_prefix=BEFORE, input_suffix=AFTER, n_predict=20).json()
    events = streamed(servers["ours"], input_prefix=BEFORE, input_suffix=AFTER, n_predict=20)
    *pieces, last = events
    assert pieces and all(event["stop"] is False for event in pieces)
    assert "".join(event["content"] for event in pieces) == whole["content"]
    assert last["stop"] is True and last["content"] == ""
    assert [last[key] for key in ("tokens_predicted", "tokens_evaluated", "stop_type")] == \
        [whole[key] for key in ("tokens_predicted", "tokens_evaluated", "stop_type")]


def test_an_infill_for_no_tokens_warms_the_cache_and_answers_nothing(servers):
    answer = infill(servers["ours"], input_extra=[{"filename": "a.py", "text": "A = 1\n" * 20}], n_predict=0)
    assert answer.status_code == 200
    assert answer.json()["content"] == "" and answer.json()["tokens_predicted"] == 0


def test_a_bad_infill_field_gets_llama_cpps_error_and_the_server_goes_on(servers, reference):
    answer = infill(servers["ours"], input_prefix=BEFORE, n_predict="many")
    assert answer.status_code == 400
    assert answer.json() == {"error": {"code": 400, "message": 'n_predict must be an integer, got "many"',
                                       "type": "invalid_request_error"}}
    assert infill(servers["ours"], input_prefix=BEFORE, n_predict=8).json()["content"] == \
        reference(f"<|fim_prefix|>{BEFORE}<|fim_suffix|><|fim_middle|>", 8)


@pytest.mark.parametrize("stream", [False, True])
def test_a_raw_fim_prompt_through_v1_completions_is_read_as_written(servers, reference, stream):
    """A client that lays out the FIM prompt itself (Continue, a plain openai client) gets plain
    greedy ``generate``'s text; that route ends only at the model's own eos."""
    texts = {}
    for name in ("ours", "plain"):
        answer = openai_client(servers[name]).completions.create(model=MODEL, prompt=QWEN_PROMPT, max_tokens=24,
                                                                 temperature=0, stream=stream)
        texts[name] = "".join(c.choices[0].text for c in answer if c.choices) if stream else answer.choices[0].text
    assert texts["ours"] == texts["plain"] == reference(QWEN_PROMPT, 24, ends=False)


# A middle (from this tiny model) whose later lines are indented by 3 characters and then 0 (a blank line)
INDENTED_BEFORE = ("\ndef _decode_uXXXX(s, pos):\n    esc = s[pos + 1:pos + 5]\n    if len(esc) == 4 and esc[1] not in 'xX':\n"
                   "        try:\n            return int(esc, 16)\n")
INDENTED_AFTER = '        except ValueError:\n            pass\n    msg = "Invalid \\\\uXXXX escape"\n'


@pytest.mark.parametrize("n_indent", [1, 4])
@pytest.mark.parametrize("name", ["ours", "plain"])
def test_n_indent_ends_the_middle_before_the_first_later_line_indented_less(servers, reference, name, n_indent):
    prompt = f"<|fim_prefix|>{INDENTED_BEFORE}<|fim_suffix|>{INDENTED_AFTER}<|fim_middle|>"
    whole = reference(prompt, 32)
    cut = short_line_at(whole, n_indent)
    assert cut is not None and cut < len(whole.rstrip())  # the unlimited middle goes on past the short line
    body = infill(servers[name], input_prefix=INDENTED_BEFORE, input_suffix=INDENTED_AFTER, n_predict=32,
                  n_indent=n_indent).json()
    assert body["content"] == whole[:cut] and body["stop_type"] == "limit"
    assert body["tokens_predicted"] < reference.counts[prompt, 32, True]  # the generation stopped there
    if name == "ours":  # streamed: the closing event says the same
        last = streamed(servers[name], input_prefix=INDENTED_BEFORE, input_suffix=INDENTED_AFTER, n_predict=32,
                        n_indent=n_indent)[-1]
        assert [last["stop_type"], last["tokens_predicted"]] == ["limit", body["tokens_predicted"]]
