"""The session benchmark's code path on a tiny model: the editor's and the chat's requests are built
as their clients send them, every system is called in turn, and our calls reuse the session's rows."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tools.bench.session_workloads import CHAT_TURNS, EDIT, chat_ids, editor_requests, windowed
from tools.bench.sessions import markdown, run_session, summarize

SYSTEMS = ["hf", "defaults", "no_reuse"]


@pytest.fixture(scope="module")
def tokenizer():
    from retrieval_draft.model.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def model():
    """A 2-layer random Llama with SmolLM2's vocabulary and a 2k context."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 2, 0
    return model


def test_editor_requests_grow_down_the_file_and_carry_the_edit_after_it(tokenizer):
    requests = editor_requests(tokenizer, count=4, tokens=(300, 1500), edit_after=2)
    sizes = [len(r.ids) for r in requests]
    assert sizes == sorted(sizes) and 300 <= sizes[0] and sizes[-1] <= 1500
    assert [r.edited for r in requests] == [False, False, True, True]
    assert EDIT[1] in tokenizer.decode(requests[2].ids) and EDIT[1] not in tokenizer.decode(requests[1].ids)
    assert all(len(r.ids) <= 256 for r in windowed(requests, 256))
    assert windowed(requests, 256)[-1].ids == requests[-1].ids[-256:]


def test_a_chat_client_resends_the_conversation_with_the_replies(tokenizer):
    first = chat_ids(tokenizer, [], CHAT_TURNS[0])
    second = chat_ids(tokenizer, [("user", CHAT_TURNS[0]), ("assistant", "def read(path): ...")], CHAT_TURNS[1])
    assert second[: len(first) - 3] == first[: len(first) - 3]  # the start recurs; the generation prompt moves on
    assert "def read(path)" in tokenizer.decode(second)


def run(model, workload, requests, tokenizer):
    models = {name: model if name == "hf" else copy.copy(model) for name in SYSTEMS}
    return run_session(workload, requests, SYSTEMS, models, tokenizer, max_new_tokens=4)


def test_the_editor_session_reuses_rows_after_its_first_request_and_after_the_edit(model, tokenizer):
    requests = editor_requests(tokenizer, count=3, tokens=(600, 1700), edit_after=1)
    records = run(model, "editor", requests, tokenizer)
    assert len(records) == 3 * len(SYSTEMS)
    ours = {r["request"]: r for r in records if r["system"] == "defaults"}
    off = [r for r in records if r["system"] == "no_reuse"]
    assert ours[0]["reused_tokens"] == 0
    assert 0 < ours[1]["reused_tokens"] < len(requests[0].ids)  # the edit near the top parts the prefix early
    assert ours[2]["reused_tokens"] >= len(requests[1].ids) - 2  # typed on below the cursor: all but the seam
    assert all(r["reused_tokens"] == 0 and "off" in r["reuse_note"] for r in off)
    assert all(r["identical"] and r["same_prompt_as_hf"] for r in records)
    summary = summarize(records, SYSTEMS)["editor"]
    assert len(summary["defaults"]["over_hf"]["per_request"]) == 3 and "over_no_reuse" in summary["defaults"]


def test_the_chat_session_starts_each_turn_from_the_conversation_so_far(model, tokenizer):
    records = run(model, "chat", list(CHAT_TURNS[:3]), tokenizer)
    ours = [r for r in records if r["system"] == "defaults"]
    assert ours[0]["reused_tokens"] == 0
    assert all(r["reused_tokens"] > ours[0]["prompt_tokens"] // 2 for r in ours[1:])
    assert all(r["identical"] and r["same_prompt_as_hf"] for r in records)
    report = markdown({"machine": {"cpu": "test"}, "threads": 1, "model": "tiny", "command": "test",
                       "load_average_before_after": [None, None], "cache_state": "test", "runs": records,
                       "summary": summarize(records, SYSTEMS)})
    assert report.count("| chat | turn ") == len(records)


def test_the_chat_workload_on_a_model_without_a_chat_template_is_refused_before_any_call(monkeypatch, capsys):
    import retrieval_draft.sessions.session
    from retrieval_draft.sessions.session import Session
    from tests.conftest import make_tiny_llama
    from tests.datastore_fixtures import word_tokenizer
    from tools.bench.sessions import main

    model = make_tiny_llama(seed=3)
    calls = []
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(retrieval_draft.sessions.session, "load_session",
                        lambda path=None: Session(model=model, tokenizer=word_tokenizer(["def", "f"])))
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "base-model", "--workloads", "editor,chat", "--rounds", "1"])
    assert exit_info.value.code == 2 and calls == []
    assert "needs a model with a chat template; base-model has none" in capsys.readouterr().err
