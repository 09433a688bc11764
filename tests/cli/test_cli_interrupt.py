"""Ctrl-C at ``retrieval-draft``: every command ends with one line, ``interrupted``, and exit code 130
(as a shell reports SIGINT), with no traceback and nothing half-written: an interrupted build leaves
nothing at ``--out``, an interrupted generation saves no history file."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from retrieval_draft.cli.generate import run
from tests.datastore_fixtures import word_tokenizer

REPO = Path(__file__).resolve().parents[2]


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def main(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of the program's own entry point."""
    from retrieval_draft_datastore.cli import main as program

    capsys.readouterr()
    code = program(argv)
    return code, capsys.readouterr().err


def test_any_command_interrupted_ends_with_one_line_and_exit_code_130(capsys):
    assert run(argparse.Namespace(func=interrupt)) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_generate_interrupted_ends_with_one_line_and_saves_no_history(tmp_path, capsys, monkeypatch):
    import retrieval_draft.sessions.session as session

    monkeypatch.setattr(session, "load_session", interrupt)
    history = tmp_path / "history.npz"
    code, err = main(["generate", "--prompt", "hi", "--history", str(history)], capsys)
    assert (code, err) == (130, "interrupted\n")
    assert list(tmp_path.iterdir()) == []


def test_build_interrupted_ends_with_one_line_and_leaves_nothing_at_out(tmp_path, capsys, monkeypatch):
    import retrieval_draft_datastore.builder as builder
    import retrieval_draft_datastore.commands as commands

    monkeypatch.setattr(commands, "_tokenizer", lambda args: word_tokenizer(["text"]))
    monkeypatch.setattr(builder, "encode_corpus", interrupt)  # inside the build, its temp folder made
    (tmp_path / "a.txt").write_text("text text\n")
    code, err = main(["build", str(tmp_path / "a.txt"), "--out", str(tmp_path / "s"), "--quiet"], capsys)
    assert (code, err) == (130, "interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]  # no store, no temp folder


# A build in a new process that signals it is inside the build (its temp folder made) and waits there:
# SIGINT arrives during the build whatever the machine's load, so the test cannot race it.
CHILD = """
import signal, sys, time
from pathlib import Path

import retrieval_draft_datastore.builder as builder
import retrieval_draft_datastore.commands as commands
from retrieval_draft_datastore.cli import main
from tests.datastore_fixtures import word_tokenizer


def encode_corpus(*args, **kwargs):
    Path(sys.argv[1]).write_text("")
    time.sleep(600)


signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever the parent ignores
builder.encode_corpus = encode_corpus
commands._tokenizer = lambda args: word_tokenizer(["text"])
sys.exit(main(sys.argv[2:]))
"""


def test_sigint_during_a_build_in_a_new_process_ends_with_one_line_and_leaves_nothing(tmp_path):
    (tmp_path / "a.txt").write_text("text text\n")
    ready = tmp_path / "ready"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(ready), "build", str(tmp_path / "a.txt"), "--out", str(tmp_path / "s"),
         "--quiet"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), child.communicate(timeout=60)[1] if child.poll() is not None else "not ready in time"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert (child.returncode, out, err) == (130, "", "interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "ready"]
