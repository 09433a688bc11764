"""``--out`` never destroys what is not ours: every command that writes a store (build, the sharded
build, merge, repo, the Ray builds) replaces a datastore atomically and refuses, before any work,
with one line and nothing changed, a file, a folder of other files, a path inside a store, or the
current folder (or one holding it) (``datastore/out_path.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retrieval_draft.errors import InvalidInputError
from retrieval_draft.store.layout import MANIFEST
from retrieval_draft.store.opening import open_datastore
from retrieval_draft_datastore.builder import build, merge
from retrieval_draft_datastore.ray_build import build_ray
from retrieval_draft_datastore.ray_shards import build_sharded_ray
from retrieval_draft_datastore.repo_store import update_repo_store
from retrieval_draft_datastore.shard_build import build_sharded
from tests.datastore_fixtures import word_tokenizer

WORDS = "the cat sat on a mat and dog ran to".split()


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer(WORDS)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, tokenizer) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture()
def scene(tmp_path, tokenizer) -> Path:
    """tmp_path holding src/ (two text files), store/ (a datastore), mydocs/notes.txt and file.txt."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("the cat sat on a mat and the dog ran to the cat\n")
    (tmp_path / "src" / "b.txt").write_text("a dog sat on the mat and the cat ran to a dog\n")
    build([str(tmp_path / "src")], tmp_path / "store", tokenizer, progress=False)
    (tmp_path / "mydocs").mkdir()
    (tmp_path / "mydocs" / "notes.txt").write_text("keep me\n")
    (tmp_path / "file.txt").write_text("mine\n")
    return tmp_path


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and folder (None) under ``root``, by relative path."""
    return {path.relative_to(root).as_posix(): (None if path.is_dir() else path.read_bytes())
            for path in sorted(root.rglob("*"))}


def main(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of the ``retrieval-draft`` program's own entry point."""
    from retrieval_draft_datastore.cli import main as program

    capsys.readouterr()
    code = program(argv)
    return code, capsys.readouterr().err


@pytest.fixture()
def no_tokenizer(monkeypatch):
    """Fail the test if a command loads its tokenizer (the refusals come before any work)."""
    import retrieval_draft_datastore.commands as commands

    def refuse(args):
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr(commands, "_tokenizer", refuse)


# (--out as given, the start of the one line printed)
REFUSED = [
    ("mydocs", "is not a datastore: a folder holding notes.txt"),
    ("file.txt", "is a file, not a datastore"),
    ("store/manifest.json", "is inside the datastore"),
    ("store/new", "is inside the datastore"),
    ("mydocs/notes.txt", "is a file, not a datastore"),
    ("file.txt/sub", "is a file, not a folder"),
    (".", "is the current directory"),
    ("..", "holds the current directory"),
]


def _commands(out: str) -> list[list[str]]:
    """Every writing command of the program aimed at ``out`` (run from scene/src)."""
    return [
        ["build", ".", "--out", out],
        ["build", ".", "--out", out, "--shard-tokens", "8"],
        ["build", ".", "--out", out, "--engine", "ray", "--workers", "1"],
        ["build", ".", "--out", out, "--engine", "ray", "--shard-tokens", "8"],
        ["merge", "../store", "../store", "--out", out],
        ["repo", ".", "--out", out],
    ]


@pytest.mark.parametrize("out, said", REFUSED, ids=[out for out, _ in REFUSED])
def test_every_writing_command_refuses_what_is_not_ours_with_one_line_and_changes_nothing(
        scene, out, said, monkeypatch, capsys, no_tokenizer):
    monkeypatch.chdir(scene / "src")
    out = out if out in (".", "..") else f"../{out}"
    before = snapshot(scene)
    for argv in _commands(out):
        code, err = main(argv, capsys)
        assert code == 2, argv
        assert err.startswith("error: --out ") and said in err and err.count("\n") == 1, (argv, err)
        assert snapshot(scene) == before, argv  # every file byte for byte, no folder made or left
    assert (scene / "mydocs" / "notes.txt").read_text() == "keep me\n"


def test_a_datastore_with_other_files_in_it_is_refused(scene, capsys, no_tokenizer):
    (scene / "store" / "notes.txt").write_text("mine too\n")
    before = snapshot(scene)
    code, err = main(["build", str(scene / "src"), "--out", str(scene / "store")], capsys)
    assert code == 2 and "is a datastore that also holds notes.txt" in err
    assert snapshot(scene) == before


def test_a_folder_whose_manifest_is_not_a_datastores_is_refused(scene, capsys, no_tokenizer):
    (scene / "web").mkdir()
    (scene / "web" / MANIFEST).write_text('{"name": "my web app"}')
    before = snapshot(scene)
    code, err = main(["merge", str(scene / "store"), str(scene / "store"), "--out", str(scene / "web")], capsys)
    assert code == 2 and "is not a datastore: a folder holding manifest.json" in err
    assert snapshot(scene) == before


def test_an_existing_store_an_empty_folder_and_a_new_path_are_written(scene, tok_dir, capsys):
    old = (scene / "store" / MANIFEST).read_bytes()
    (scene / "empty").mkdir()
    (scene / "src" / "c.txt").write_text("the mat ran to the dog\n")
    for out in ("store", "empty", "new/deeper"):
        code, err = main(["build", str(scene / "src"), "--out", str(scene / out), "--tokenizer", str(tok_dir),
                          "--quiet"], capsys)
        assert code == 0, err
        assert open_datastore(scene / out).manifest["stats"]["documents"] == 3
    assert (scene / "store" / MANIFEST).read_bytes() != old  # replaced
    code, err = main(["merge", str(scene / "store"), str(scene / "empty"), "--out", str(scene / "store")], capsys)
    assert code == 0, err
    assert open_datastore(scene / "store").manifest["stats"]["documents"] == 6
    assert not [p for p in os.listdir(scene) if p.startswith(".")]  # no temp folder left


def test_the_library_writers_refuse_before_any_work(scene, tokenizer):
    """The same rule holds for the functions the commands call (ray's before its runtime starts)."""
    writers = [
        lambda out: build([str(scene / "src")], out, tokenizer, progress=False),
        lambda out: build_sharded([str(scene / "src")], out, tokenizer, 8, progress=False),
        lambda out: merge(scene / "store", scene / "store", out),
        lambda out: update_repo_store(scene / "src", out, tokenizer),
        lambda out: build_ray([str(scene / "src")], out, tokenizer, progress=False),
        lambda out: build_sharded_ray([str(scene / "src")], out, tokenizer, 8, progress=False),
    ]
    before = snapshot(scene)
    for write in writers:
        for out in ("mydocs", "file.txt", "store/manifest.json"):
            with pytest.raises(InvalidInputError, match=r"^--out "):
                write(scene / out)
    assert snapshot(scene) == before
    import ray

    assert not ray.is_initialized()


def test_files_that_appear_at_out_during_a_build_are_not_replaced(scene, tokenizer, monkeypatch):
    """``publish`` checks ``out`` again just before the swap."""
    import retrieval_draft_datastore.builder as builder

    real = builder.write_index

    def meanwhile(*args, **kwargs):
        (scene / "late").mkdir()
        (scene / "late" / "notes.txt").write_text("written during the build\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(builder, "write_index", meanwhile)
    with pytest.raises(InvalidInputError, match="a folder holding notes.txt"):
        build([str(scene / "src")], scene / "late", tokenizer, progress=False)
    assert os.listdir(scene / "late") == ["notes.txt"]
    assert not [p for p in os.listdir(scene) if p.startswith(".")]
