"""The HTTP session benchmark's code path with stand-in clients (the server tests drive real servers):
the warming client reads the text above the cursor's line before each completion, every server gets
every request, and the summary is the plain server's round trip over each server's."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tools.bench.http_sessions import chat_session, editor_session, main, markdown, summarize
from tools.bench.session_workloads import CHAT_TURNS, EDIT, editor_requests


class StandInClient:
    """Answers every request with ``answer`` and notes what it was sent."""

    def __init__(self, answer: str) -> None:
        self.sent: list[dict] = []
        self.answer = answer
        self.completions = SimpleNamespace(create=self._complete)
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._chat))

    def _complete(self, **request):
        time.sleep(0.002)  # a round trip long enough for the records' 0.1 ms resolution
        self.sent.append(request)
        text = "" if request["max_tokens"] == 0 else self.answer
        return SimpleNamespace(choices=[SimpleNamespace(text=text)])

    def _chat(self, **request):
        time.sleep(0.002)
        self.sent.append(request)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.answer))])


@pytest.fixture(scope="module")
def requests():
    from retrieval_draft.model.models import load_tokenizer

    return editor_requests(load_tokenizer(), count=3, tokens=(300, 1500), edit_after=1)


def test_editor_requests_grow_down_the_file_and_carry_the_edit_after_it():
    from retrieval_draft.model.models import load_tokenizer

    tokenizer = load_tokenizer()
    requests = editor_requests(tokenizer, count=4, tokens=(300, 1500), edit_after=2)
    sizes = [len(r.ids) for r in requests]
    assert sizes == sorted(sizes) and 300 <= sizes[0] and sizes[-1] <= 1500
    assert [r.edited for r in requests] == [False, False, True, True]
    assert EDIT[1] in tokenizer.decode(requests[2].ids) and EDIT[1] not in tokenizer.decode(requests[1].ids)


def test_the_warm_text_is_the_request_text_less_the_cursors_line(requests):
    for request in requests:
        assert request.text.startswith(request.warm_text) and request.text != request.warm_text
        assert request.text[len(request.warm_text):].count("\n") == 1  # one line: the cursor's


def test_the_editor_session_warms_only_its_warming_servers_and_compares_with_plain(requests):
    clients = {"plain": StandInClient("x = 1"), "ours": StandInClient("x = 1"), "ours_warm": StandInClient("x = 2"),
               "llama_ngram-mod": StandInClient("x = 1")}
    records = editor_session(clients, "m", requests, log=lambda _: None)
    for warmed in ("ours_warm", "llama_ngram-mod"):  # llama.vim warms llama.cpp's server; ours_warm as it does
        warm = [r for r in clients[warmed].sent if r["max_tokens"] == 0]
        assert [r["prompt"] for r in warm] == [q.warm_text for q in requests]
    assert all(r["max_tokens"] > 0 for r in clients["ours"].sent + clients["plain"].sent)
    assert [r["prompt"] for r in clients["ours"].sent] == [q.text for q in requests]
    by_server = {name: [r["identical"] for r in records if r["system"] == name] for name in clients}
    assert by_server == {"plain": [True] * 3, "ours": [True] * 3, "ours_warm": [False] * 3, "llama_ngram-mod": [True] * 3}
    assert all((r["warm_s"] is not None) == (r["system"] in ("ours_warm", "llama_ngram-mod")) for r in records)
    summary = summarize(records)["editor"]
    assert summary["plain"]["median"] == 1.0 and summary["ours"]["requests"] == 3 and summary["ours"]["identical"] == 3
    assert "| editor | ours_warm |" in markdown({
        "model": "m", "machine": {"date": "d", "cpu": "c", "cores": 2, "torch": "t", "transformers": "t",
                                  "load_avg_start": None}, "load_avg_end": None, "command": "c", "cache": "c",
        "overhead_s": {"plain": 0.01, "ours": 0.02}, "records": records, "summary": summarize(records)})


def test_the_chat_session_resends_each_servers_own_replies():
    clients = {"plain": StandInClient("A"), "ours": StandInClient("A"), "ours_warm": StandInClient("B"),
               "llama": StandInClient("C")}
    records = chat_session(clients, "m", log=lambda _: None)
    assert clients["ours_warm"].sent == clients["llama"].sent == [] and len(records) == 2 * len(CHAT_TURNS)
    last = clients["ours"].sent[-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant"] * (len(CHAT_TURNS) - 1) + ["user"]
    assert last[-1]["content"] == CHAT_TURNS[-1] and all(r["identical"] for r in records)


def test_an_unknown_workload_is_refused_before_any_server_starts(capsys):
    with pytest.raises(SystemExit):
        main(["--workloads", "editor,bogus"])
    assert "unknown workloads ['bogus']" in capsys.readouterr().err
