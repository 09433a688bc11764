"""The FIM editor session (``tools.bench.fim_session``) with stand-in servers, its requests
(``session_workloads.fim_requests``) and llama.cpp's server as a peer (``tools.bench.llama_server``):
a model or machine that cannot run it is a reason in the report, not a crash."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tools.bench import fim_session, llama_server
from tools.bench.http_sessions import markdown, summarize
from tools.bench.session_workloads import FIM_NEW_TOKENS, fim_requests

SOURCE = ("".join(f"def f{i}(x):\n    # step {i}\n    return x + {i}\n\n" for i in range(30)), "toy.py")


def test_fim_requests_walk_the_file_down_with_windows_of_lines_above_and_below():
    requests = fim_requests(count=4, window=(12, 5), source=SOURCE)
    lines = SOURCE[0].splitlines(keepends=True)
    cursors = [int(r.request_id.split(":")[1]) for r in requests]
    assert cursors == sorted(cursors) and cursors[0] > 12 and cursors[-1] <= len(lines) - 5
    for request, cursor in zip(requests, cursors):
        line = lines[cursor - 1]
        assert line.strip() and not line.lstrip().startswith("#")  # a code line
        assert request.warm_before == "".join(lines[cursor - 13 : cursor - 1])  # 12 lines above
        assert request.before == request.warm_before + line[: len(line) - len(line.lstrip())]  # and its indentation
        assert request.after == "\n" + "".join(lines[cursor : cursor + 5])  # the (empty) rest, then 5 lines below
    with pytest.raises(ValueError, match="code lines"):
        fim_requests(count=200, window=(12, 5), source=SOURCE)


def test_the_fim_session_warms_the_warmed_servers_and_compares_each_middle_with_plains(monkeypatch):
    sent = []

    def answer(server, path, body):  # a stand-in for post_json: each server answers its own middle
        time.sleep(0.002)  # a round trip long enough for the records' 0.1 ms resolution
        sent.append((server, path, body))
        return {"content": "" if body["n_predict"] == 0 else {"plain": "x", "ours_warm": "x", "llama": "y"}[server],
                "tokens_predicted": body["n_predict"]}

    monkeypatch.setattr(fim_session, "post_json", answer)
    requests = fim_requests(count=2, window=(12, 5), source=SOURCE)
    servers = {"plain": "plain", "ours_warm": "ours_warm", "llama": "llama"}
    records = fim_session.fim_session(servers, requests, log=lambda _: None)
    warms = [(server, body["input_prefix"]) for server, _, body in sent if body["n_predict"] == 0]
    assert warms == [(name, r.warm_before) for r in requests for name in ("ours_warm", "llama")]  # plain: never
    asks = [body for _, path, body in sent if body["n_predict"] == FIM_NEW_TOKENS and path == "/infill"]
    assert len(asks) == 6 and all(body["temperature"] == 0 for body in asks)
    assert {(r["system"], r["identical"]) for r in records} == {("plain", True), ("ours_warm", True), ("llama", False)}
    assert all((r["warm_s"] is None) == (r["system"] == "plain") for r in records)
    summary = summarize(records)["fim"]
    assert summary["llama"]["requests"] == 2 and summary["llama"]["total_s"] >= summary["llama"]["median_s"] > 0
    report = markdown({"model": "m", "machine": {"date": "d", "cpu": "c", "cores": 2, "torch": "t", "transformers": "t",
                                                 "load_avg_start": None}, "load_avg_end": None, "command": "c", "cache": "c",
                       "overhead_s": {"plain": 0.01, "ours": 0.02}, "unavailable": {"llama_x": "no cmake"},
                       "records": records, "summary": summarize(records)})
    assert "| fim | llama |" in report and "Unavailable: llama_x: no cmake." in report


def test_llama_cpp_is_reported_unavailable_with_the_reason(monkeypatch, tmp_path):
    assert fim_session.llama_peers(None)[1]["llama"].startswith("the model is not a GGUF file")
    monkeypatch.setattr(llama_server.shutil, "which", lambda tool: None)
    monkeypatch.setattr(fim_session, "binary", lambda: llama_server.binary(tmp_path / "none"))
    peers, unavailable = fim_session.llama_peers(Path("model.gguf"))
    assert peers == {} and set(unavailable) == {"llama", "llama_ngram-simple", "llama_ngram-mod"}
    assert unavailable["llama"] == "llama-server cannot be built here: cmake is not installed (apt-get install cmake)"


def test_llama_servers_command_line_names_the_file_the_port_and_the_speculation(tmp_path):
    kept = tmp_path / "bin"
    kept.mkdir()
    (kept / "llama-server").write_text("")
    server = llama_server.binary(kept)  # a kept build is used as it is
    argv = llama_server.command(server, Path("m.gguf"), "ngram-simple")("127.0.0.1", 8012)
    assert argv[:5] == [str(server), "-m", "m.gguf", "--host", "127.0.0.1"] and argv[-2:] == ["--spec-type", "ngram-simple"]
    assert "--spec-type" not in llama_server.command(server, Path("m.gguf"))("127.0.0.1", 8012)
    assert llama_server.environment(server)["LD_LIBRARY_PATH"].split(":")[0] == str(kept)
    with pytest.raises(ValueError, match="spec_type"):
        llama_server.command(server, Path("m.gguf"), "eagle")


def test_the_fim_workload_refuses_a_model_without_fim_tokens_before_starting_a_server(capsys):
    from tools.bench.http_sessions import main

    with pytest.raises(SystemExit) as stopped:
        main(["--workloads", "fim", "--model", "smollm2-135m", "--out", "unused"])
    assert stopped.value.code == 2 and "smollm2-135m has no fill-in-the-middle tokens" in capsys.readouterr().err


def test_the_fim_run_starts_llama_peers_beside_ours_and_records_its_own_command(monkeypatch, tmp_path):
    """``main`` with ``--workloads fim`` and a llama.cpp peer (servers stood in): every server is
    started with its own command line and the report records the run's command as given."""
    import contextlib

    from tests.doc_preamble import FIM_TOKENS, tiny_model_folder
    from tools.bench import http_sessions

    folder = tiny_model_folder(tmp_path / "coder", "tiny-coder", FIM_TOKENS)
    started, written = [], {}

    @contextlib.contextmanager
    def served(*starts, logs, envs):
        started.extend(starts)
        yield [f"server-{i}" for i in range(len(starts))]

    def peer_start(host, port):
        return ["llama-server", "--port", str(port)]

    monkeypatch.setattr(http_sessions, "served", served)
    monkeypatch.setattr(http_sessions, "llama_peers", lambda gguf: ({"llama": (peer_start, {"X": "1"})}, {}))
    monkeypatch.setattr(http_sessions, "openai_client", lambda server: server)
    monkeypatch.setattr(http_sessions, "overhead", lambda client, model: 0.01)
    monkeypatch.setattr(http_sessions, "fim_session", lambda servers, requests, log: [])
    monkeypatch.setattr(http_sessions, "write_results", lambda out, result, text: written.update(result))
    argv = ["--workloads", "fim", "--model", str(folder), "--out", str(tmp_path / "out")]
    assert http_sessions.main(argv) == 0
    assert started[-1] is peer_start and all(isinstance(start, list) for start in started[:-1])
    assert written["command"] == "python -m tools.bench.http_sessions " + " ".join(argv)


def test_results_keep_a_dotted_prefix_whole(tmp_path, capsys):
    """``report.write_results`` appends .json and .md to the prefix: a model name's dot
    (``qwen2.5-coder-0.5b``) is not taken for an extension."""
    import json

    from tools.bench.report import write_results

    prefix = tmp_path / "2026-11-29-qwen2.5-coder-0.5b-http-fim"
    write_results(prefix, {"a": 1}, "# report\n")
    assert json.loads((tmp_path / f"{prefix.name}.json").read_text()) == {"a": 1}
    assert (tmp_path / f"{prefix.name}.md").read_text() == "# report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{prefix.name}.json", f"{prefix.name}.md"]
