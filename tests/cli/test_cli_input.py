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


KNOWN_NAMES = "(give a local folder, a .gguf file or one of the names smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b)"


def main(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of the program's own entry point."""
    from retrieval_draft_datastore.cli import main as program

    capsys.readouterr()
    code = program(argv)
    return code, capsys.readouterr().err


@pytest.fixture()
def no_model(monkeypatch):
    """Fail the test if ``generate`` gets as far as loading its model."""
    import retrieval_draft.sessions.session as session

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
        assert code == 2 and err == f"error: tokenizer path not found: nope {KNOWN_NAMES}\n", argv
    code, err = main(["build", str(tmp_path / "a.txt"), "--out", str(tmp_path / "t"), "--model", "nope"], capsys)
    assert code == 2 and err == f"error: model path not found: nope {KNOWN_NAMES}\n"


def test_a_history_file_that_is_not_one_says_so_without_mentioning_pickle(notes, capsys, no_model):
    code, err = main(["generate", "--prompt", "hi", "--history", str(notes / "notes.txt")], capsys)
    assert code == 2
    assert err == f"error: {notes / 'notes.txt'} is not a readable history file (not an .npz archive)\n"


def test_a_missing_prompt_file_is_one_line_error_naming_the_flag_and_path(tmp_path, capsys, no_model):
    missing = tmp_path / "missing.txt"
    code, err = main(["generate", "--prompt-file", str(missing)], capsys)
    assert code == 2 and err == f"error: --prompt-file {missing}: no such file\n"
    code, err = main(["generate", "--prompt-file", str(tmp_path)], capsys)
    assert code == 2 and err == f"error: --prompt-file {tmp_path}: Is a directory\n"


def test_cache_with_an_unknown_model_lists_the_model_names_it_knows(capsys):
    code, err = main(["cache", "--model", "bogus"], capsys)
    assert code == 2 and err == f"error: model path not found: bogus {KNOWN_NAMES}\n"


def test_a_missing_store_says_no_datastore_is_there(tmp_path, capsys):
    code, err = main(["stats", str(tmp_path / "does-not-exist")], capsys)
    assert code == 2 and err == f"error: no datastore at {tmp_path / 'does-not-exist'}: the path does not exist\n"


def test_a_binary_file_named_as_a_source_is_refused_before_the_tokenizer_loads_and_nothing_is_written(
        tmp_path, capsys, monkeypatch):
    import retrieval_draft_datastore.commands as commands

    monkeypatch.setattr(commands, "_tokenizer", lambda args: pytest.fail("the tokenizer was loaded"))
    image = tmp_path / "ls.bin"
    image.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    code, err = main(["build", str(image), "--out", str(tmp_path / "s")], capsys)
    assert code == 2 and err == (f"error: source {image} is not a text file (a NUL byte in its first 8192 bytes); "
                                 "name text, .jsonl or .parquet files\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ls.bin"]


def test_a_binary_file_inside_a_folder_is_skipped_by_the_same_rule(tmp_path):
    from retrieval_draft_datastore.sources import SourceOptions, iter_documents

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("text\n")
    (tmp_path / "docs" / "ls.bin").write_bytes(b"\x7fELF\x00\x01")
    assert list(iter_documents([str(tmp_path / "docs")], SourceOptions())) == ["text\n"]


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
