"""The ``retrieval-draft`` parser against docs/command-line.md and the test suite: the synopsis names
every flag of every subcommand on that subcommand's line, and nothing else; the ``--drafters`` list
names every drafter; every flag is passed by at least one test."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from retrieval_draft.drafters.registry import DRAFTERS

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "command-line.md"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    from retrieval_draft_datastore.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for s in parser._option_string_actions if s.startswith("--") and s != "--help"}


def synopsis() -> dict[str, str]:
    """Subcommand -> its usage text in the first fenced block of docs/command-line.md (indented lines
    continue the line above; a line may hold two commands)."""
    block = DOC.read_text(encoding="utf-8").split("```")[1]
    merged: list[str] = []
    for line in block.splitlines():
        if line.startswith(" ") and merged:
            merged[-1] += " " + line.strip()
        elif line.strip():
            merged.append(line.strip())
    usage: dict[str, str] = {}
    for line in merged:
        for part in re.split(r"(?=\bretrieval-draft )", line):
            if part.strip():
                name = part.split()[1]
                assert name not in usage, f"docs/command-line.md shows retrieval-draft {name} twice"
                usage[name] = part
    return usage


def test_the_synopsis_names_exactly_each_subcommands_flags():
    usage = synopsis()
    parsers = subcommands()
    assert sorted(usage) == sorted(parsers), "docs/command-line.md: subcommands shown != the program's"
    for name, parser in parsers.items():
        shown = set(FLAG.findall(usage[name]))
        assert sorted(flags(parser) - shown) == [], f"retrieval-draft {name}: flags missing from docs/command-line.md"
        assert sorted(shown - flags(parser)) == [], f"retrieval-draft {name}: docs/command-line.md names flags it lacks"


def test_the_synopsis_lists_every_drafter_name():
    (listed,) = re.findall(r"--drafters ([a-z,|]+)", synopsis()["generate"])
    assert sorted(listed.replace("|", ",").split(",")) == sorted([*DRAFTERS, "all"])


def test_every_flag_is_passed_by_some_test():
    """A flag counts as passed when some test module other than this one holds it as a string
    literal ("--flag"), the way argv lists are written."""
    here = Path(__file__).resolve()
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "tests").rglob("*.py") if p.resolve() != here)
    every = {flag for parser in subcommands().values() for flag in flags(parser)}
    unpassed = sorted(f for f in every if f'"{f}"' not in sources and f"'{f}'" not in sources)
    assert unpassed == [], f"no test passes {unpassed}"


def every_parser() -> dict[str, argparse.ArgumentParser]:
    """The program's parser and each subcommand's, by the words that run them."""
    from retrieval_draft_datastore.cli import build_parser

    return {"retrieval-draft": build_parser(), **{f"retrieval-draft {n}": p for n, p in subcommands().items()}}


def test_no_help_text_shows_double_backticks():
    for name, parser in every_parser().items():
        assert "``" not in parser.format_help(), f"{name} --help shows ``"


def test_every_argument_of_every_command_has_help_text():
    missing = [f"{name} {action.option_strings or action.dest}"
               for name, parser in every_parser().items()
               for action in parser._actions
               if not isinstance(action, argparse._HelpAction) and not action.help]
    assert missing == []


def test_version_prints_the_packages_version(capsys):
    from retrieval_draft_datastore.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == "retrieval-draft 0.1.0\n"
