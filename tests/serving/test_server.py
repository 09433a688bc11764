"""``retrieval-draft serve`` over HTTP, driven by the ``openai`` client as editors and chat front-ends do.

Two servers run for the module, each a ``retrieval-draft serve`` process on a free port over the doc
tests' tiny model (random weights, a 400-id tokenizer with a chat template): ours, and ``--plain``
(``transformers serve`` over the same model folder without our decoding), the reference for every
answer. What a call of ours did is read from the server's log (one ``[retrieval-draft]`` line per call).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from tests.doc_preamble import tiny_model_folder
from tools.bench.http_servers import openai_client, served

MODEL = "tiny-model"  # the served name: the model folder's name
CODE = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(ours, plain): the openai clients and the servers, both over the tiny model."""
    folder = tiny_model_folder(tmp_path_factory.mktemp("model"))
    with served(["--model", str(folder)], ["--plain", "--model", str(folder)],
                logs=tmp_path_factory.mktemp("logs")) as (ours, plain):
        yield {"ours": (openai_client(ours), ours), "plain": (openai_client(plain), plain)}


def complete(client, prompt: str, **kwargs) -> str:
    """The completion's text, streamed chunks joined when ``stream=True``."""
    kwargs = {"max_tokens": 24, "temperature": 0, **kwargs}
    if kwargs.get("stream"):
        return "".join(chunk.choices[0].text for chunk in client.completions.create(model=MODEL, prompt=prompt, **kwargs)
                       if chunk.choices)
    return client.completions.create(model=MODEL, prompt=prompt, **kwargs).choices[0].text


def chat(client, messages: list[dict], **kwargs) -> str:
    """The chat reply's content, streamed deltas joined when ``stream=True``."""
    kwargs = {"max_tokens": 24, "temperature": 0, **kwargs}
    answer = client.chat.completions.create(model=MODEL, messages=messages, **kwargs)
    if kwargs.get("stream"):
        return "".join(chunk.choices[0].delta.content or "" for chunk in answer if chunk.choices)
    return answer.choices[0].message.content


def calls(server, since: int = 0) -> list[tuple[int, int, int]]:
    """(prompt tokens, reused, new) of each call of ours the server's log records, from line ``since``."""
    found = re.findall(r"\[retrieval-draft\] (\d+) prompt tokens \((\d+) reused, \d+ read\), (\d+) new",
                       server.log_text())
    return [tuple(map(int, call)) for call in found[since:]]


@pytest.mark.parametrize("stream", [False, True])
def test_completions_equal_the_plain_servers(servers, stream):
    (ours, _), (plain, _) = servers["ours"], servers["plain"]
    for prompt in (CODE, "class Stack:\n    def __init__(self):\n", "import os\n\n"):
        assert complete(ours, prompt, stream=stream) == complete(plain, prompt, stream=stream)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_with_a_suffix_equal_the_plain_servers(servers, stream):
    (ours, _), (plain, _) = servers["ours"], servers["plain"]
    suffix = "\n\nprint(fibonacci(10))\n"
    got = complete(ours, CODE, suffix=suffix, stream=stream)
    assert got == complete(plain, CODE, suffix=suffix, stream=stream) and got.endswith(suffix)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_the_plain_servers_turn_after_turn(servers, stream):
    (ours, _), (plain, _) = servers["ours"], servers["plain"]
    histories = {"ours": [], "plain": []}
    for turn in ("Write a function that adds two numbers.", "Now make it add three."):
        replies = {}
        for name, client in (("ours", ours), ("plain", plain)):
            histories[name].append({"role": "user", "content": turn})
            replies[name] = chat(client, histories[name], stream=stream)
            histories[name].append({"role": "assistant", "content": replies[name]})
        assert replies["ours"] == replies["plain"]


def test_an_editors_next_request_reads_only_its_new_text(servers):
    (ours, server), (plain, _) = servers["ours"], servers["plain"]
    first = CODE * 3
    seen = len(calls(server))
    answer = complete(ours, first)
    follow = first + answer + "\n\ndef main():\n"
    assert complete(ours, follow) == complete(plain, follow)
    (_, _, new_first), (prompt, reused, _) = calls(server, seen)
    assert reused >= prompt - 12 and reused > 0  # the first request's prompt and answer, less a re-tokenised edge


def test_a_request_for_no_tokens_warms_the_cache_for_the_next(servers):
    (ours, server), (plain, _) = servers["ours"], servers["plain"]
    text = "".join(f"def function_{i}(value):\n    return value * {i}\n\n" for i in range(6))
    seen = len(calls(server))
    answer = ours.completions.create(model=MODEL, prompt=text, max_tokens=0, temperature=0)
    assert answer.choices[0].text == "" and answer.usage.completion_tokens == 0
    request = text + "def function_6(value):\n"
    assert complete(ours, request) == complete(plain, request)
    (warm_prompt, _, warm_new), (prompt, reused, _) = calls(server, seen)
    assert warm_new == 0 and reused >= warm_prompt - 2 and prompt - reused <= 12


def test_four_concurrent_clients_get_their_single_client_answers(servers):
    (ours, _), (plain, _) = servers["ours"], servers["plain"]
    prompts = [f"def task_{i}(items):\n    total = 0\n    for item in items:\n" for i in range(4)]
    alone = [complete(plain, prompt) for prompt in prompts]
    answers: dict[int, str] = {}

    def client(index: int) -> None:
        answers[index] = complete(ours, prompts[index], stream=index % 2 == 1)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)
    assert [answers.get(i) for i in range(4)] == alone


def test_a_bad_request_gets_an_error_and_the_server_serves_the_next(servers):
    (ours, server), (plain, _) = servers["ours"], servers["plain"]
    with pytest.raises(openai.InternalServerError):  # beams: refused by our generate, before any model work
        ours.completions.create(model=MODEL, prompt=CODE, max_tokens=8,
                                extra_body={"generation_config": '{"num_beams": 2, "max_new_tokens": 8}'})
    assert "[retrieval-draft] refused: num_beams=2 is not supported" in server.log_text()
    # the server closes the connection after a 500 (uvicorn, on an exception in the app): the openai
    # client retries on a new one by default; this one has no retries, so a new client goes on
    ours = openai_client(server)
    with pytest.raises(openai.BadRequestError):  # the server's own check
        ours.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=8)
    with pytest.raises(openai.UnprocessableEntityError):  # our options are the server's, not a request's
        ours.completions.create(model=MODEL, prompt=CODE, max_tokens=8, extra_body={"tree_budget": 4})
    assert complete(ours, CODE) == complete(plain, CODE)


@pytest.mark.parametrize("name", ["ours", "plain"])
def test_infill_for_a_model_without_fim_tokens_is_refused_in_one_line(servers, name):
    _, server = servers[name]
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/infill", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"input_prefix": CODE, "input_suffix": "\n", "n_predict": 8}).encode())
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    assert caught.value.code == 501
    error = json.loads(caught.value.read())["error"]
    assert error["type"] == "not_supported_error" and error["code"] == 501
    assert error["message"].startswith(f"{MODEL} has no fill-in-the-middle tokens") and "\n" not in error["message"]
    assert complete(openai_client(server), CODE) == complete(servers["plain"][0], CODE)  # and it serves on


# 900 tokens unless stopped (no eos before); sampled from the random model's flat distribution, so no
# draft is accepted and each token is a step of its own (greedy, the output history could replay the
# 900 tokens in a few steps): about 1 ms a token here
LONG = json.dumps({"max_new_tokens": 900, "min_new_tokens": 900, "do_sample": True, "top_k": 0})
GONE = r"client gone: generation stopped after (\d+) new tokens|client gone before its generation started"


def send_raw(server, body: dict) -> socket.socket:
    """A connection on which ``body`` was POSTed to ``/v1/completions`` (the answer left unread)."""
    data = json.dumps(body).encode()
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return connection


def wait_for(server, pattern: str, since: int) -> re.Match:
    """The first match of ``pattern`` in the server's log after character ``since``, waiting up to 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(pattern, server.log_text()[since:])
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {pattern!r} in the server's log:\n{server.log_text()[since:][-2000:]}")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", ["ours", "plain"])
def test_a_client_that_leaves_stops_its_generation_and_the_next_request_is_served(servers, name, stream):
    """The abandoned request asked for 900 tokens; the log says it stopped well before, and the next
    request, queued behind it, is answered as the plain server answers it."""
    client, server = servers[name]
    since = len(server.log_text())
    connection = send_raw(server, {"model": MODEL, "prompt": f"class Leaving{name}{stream}:\n", "stream": stream,
                                   "generation_config": LONG})
    if stream:
        assert connection.recv(4096).startswith(b"HTTP/1.1 200")  # headers, then the first pieces: it runs
        assert b"data: " in connection.recv(4096)
    else:  # it runs from a moment after it is received (if it has not started, it never will)
        wait_for(server, r"Request received", since)
        time.sleep(0.1)
    connection.close()
    assert complete(client, CODE) == complete(servers["plain"][0], CODE)
    stopped = wait_for(server, GONE, since)
    assert stopped.group(1) is None or int(stopped.group(1)) < 900
    if name == "ours" and stopped.group(1) is not None and not stream:  # its own line, before the next's, agrees
        assert calls(server)[-2][2] == int(stopped.group(1))


def test_a_request_whose_client_left_while_it_waited_is_not_generated(servers):
    (ours, server), (plain, _) = servers["ours"], servers["plain"]
    since = len(server.log_text())
    running = send_raw(server, {"model": MODEL, "prompt": "class Running:\n", "stream": True, "generation_config": LONG})
    assert b"data: " in running.recv(4096) + running.recv(4096)  # generating now
    queued = send_raw(server, {"model": MODEL, "prompt": "class Queued:\n", "generation_config": LONG})
    wait_for(server, r"Request received[^\n]*\n(.|\n)*Request received", since)  # both arrived
    queued.close()
    time.sleep(0.1)  # the server sees the queued request's client go
    running.close()
    wait_for(server, r"client gone before its generation started: nothing generated", since)
    assert complete(ours, CODE) == complete(plain, CODE)
