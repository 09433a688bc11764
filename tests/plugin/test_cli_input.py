"""Wrong input a user plausibly types at ``retrieval-draft``: one whole ``error:`` line, exit code 2,
and nothing loaded that the error makes useless (the model above all); a reader that closes the
pipe early ends the program quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from retrieval_draft_datastore.builder import build
from tests.datastore_fixtures import word_tokenizer


def main(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of the program's own entry point."""
    from retrieval_draft_datastore.cli import main as program

    capsys.readouterr()
    code = program(argv)
    return code, capsys.readouterr().err


@pytest.fixture()
def no_model(monkeypatch):
    """Fail the test if ``generate`` gets as far as loading its model."""
    import retrieval_draft.session as session

    monkeypatch.setattr(session, "load_session", lambda *a, **k: pytest.fail("the model was loaded"))


@pytest.fixture()
def notes(tmp_path) -> Path:
    (tmp_path / "mydocs").mkdir()
    (tmp_path / "mydocs" / "notes.txt").write_text("not a model, not a history\n")
    return tmp_path / "mydocs"


def test_an_unknown_drafter_is_refused_before_the_model_loads(capsys, no_model):
    code, err = main(["generate", "--prompt", "hi", "--drafters", "prompt,bogus"], capsys)
    assert code == 2
    assert err == "error: unknown drafters ['bogus']; choose from prompt, ngram, suffix, history, recycle, candidates\n"


def test_a_store_drafter_without_a_datastore_is_refused_before_the_model_loads(capsys, no_model):
    code, err = main(["generate", "--prompt", "hi", "--drafters", "prompt,suffix"], capsys)
    assert code == 2 and err == "error: --drafters suffix needs a datastore (--datastore DIR)\n"


def test_a_model_folder_holding_no_model_is_one_whole_line(notes, capsys, no_model):
    code, err = main(["generate", "--prompt", "hi", "--model", str(notes)], capsys)
    assert code == 2
    assert err == (f"error: {notes} is not a model folder: it holds no config.json, tokenizer.json, "
                   "tokenizer_config.json or .gguf file\n")


def test_a_loader_error_of_several_lines_is_printed_whole_on_one(tmp_path, capsys):
    """transformers' message for a folder with no usable tokenizer runs over five lines; it used to be
    cut after its first ('...from one of: ')."""
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer_config.json").write_text("{}")
    (tmp_path / "a.txt").write_text("text\n")
    code, err = main(["build", str(tmp_path / "a.txt"), "--out", str(tmp_path / "s"), "--model",
                      str(tmp_path / "broken")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: cannot load a tokenizer from {tmp_path / 'broken'}: ")
    assert "from one of: (1)" in err and "(3)" in err


def test_a_missing_tokenizer_is_called_a_tokenizer(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("text\n")
    build([str(tmp_path / "a.txt")], tmp_path / "s", word_tokenizer(["text"]), progress=False)
    for argv in (["build", str(tmp_path / "a.txt"), "--out", str(tmp_path / "t"), "--tokenizer", "nope"],
                 ["inspect", str(tmp_path / "s"), "--query", "text", "--tokenizer", "nope"]):
        code, err = main(argv, capsys)
        assert code == 2 and err == "error: tokenizer path not found: nope\n", argv
    code, err = main(["build", str(tmp_path / "a.txt"), "--out", str(tmp_path / "t"), "--model", "nope"], capsys)
    assert code == 2 and err == "error: model path not found: nope\n"


def test_a_history_file_that_is_not_one_says_so_without_mentioning_pickle(notes, capsys, no_model):
    code, err = main(["generate", "--prompt", "hi", "--history", str(notes / "notes.txt")], capsys)
    assert code == 2
    assert err == f"error: {notes / 'notes.txt'} is not a readable history file (not an .npz archive)\n"


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_a_reader_that_closes_the_pipe_early_ends_the_program_quietly(tmp_path, unbuffered):
    """``retrieval-draft stats S | head``: no traceback, the shell's exit code for a closed pipe."""
    (tmp_path / "a.txt").write_text("text text\n")
    build([str(tmp_path / "a.txt")], tmp_path / "s", word_tokenizer(["text"]), progress=False)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the program writes
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    try:
        result = subprocess.run([sys.executable, "-m", "retrieval_draft_datastore.cli", "stats", str(tmp_path / "s")],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    finally:
        os.close(write_end)
    assert result.stderr == "" and result.returncode == 141
